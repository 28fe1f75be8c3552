/* Device memory, copies and streams as td_err calls (kernels/cuda_mem.h). */
#include <string.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/stream_buf.cuh"

extern "C" {
#include "kernels/cuda_mem.h"
}

/* A failed runtime call also sits in CUDA's last-error slot; clear it so the next launch
 * check (CUDA_TRY_LAUNCH) does not report this failure a second time. */
static td_err mem_fail(cudaError_t e, const char *what, size_t bytes)
{
    (void)cudaGetLastError();
    if (e == cudaErrorMemoryAllocation)
        return err_set(TD_ENOMEM, "%s: the device has no room for %zu bytes", what, bytes);
    return err_set(TD_ECUDA, "%s (%zu bytes): %s", what, bytes, cudaGetErrorString(e));
}

extern "C" bool cuda_available(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        return false;
    }
    /* cudaFree(NULL) makes the context: fails on a prohibited or broken device */
    if (cudaFree(NULL) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

extern "C" td_err cuda_context_lean(void)
{
    static const struct {
        cudaLimit limit;
        size_t value;
        const char *what;
    } set[] = {
        {cudaLimitStackSize, CUDA_STACK_BYTES, "stack"},
        {cudaLimitMallocHeapSize, 0, "malloc heap"},
        {cudaLimitPrintfFifoSize, 0, "printf buffer"},
    };
    td_err e = TD_OK;
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) {
        cudaError_t r = cudaDeviceSetLimit(set[i].limit, set[i].value);
        if (r != cudaSuccess) {
            (void)cudaGetLastError(); /* not left for the next launch check */
            if (e == TD_OK)
                e = err_set(TD_ECUDA, "cudaDeviceSetLimit(%s): %s", set[i].what,
                            cudaGetErrorString(r));
        }
    }
    return e;
}

extern "C" size_t cuda_stack_bytes(void)
{
    size_t v = 0;
    if (cudaDeviceGetLimit(&v, cudaLimitStackSize) != cudaSuccess)
        (void)cudaGetLastError();
    return v;
}

extern "C" td_err cuda_mem_alloc(void **p, size_t bytes)
{
    TD_ASSERT(p != NULL);
    *p = NULL;
    if (bytes == 0)
        return TD_OK;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        *p = NULL;
        return mem_fail(e, "cudaMalloc", bytes);
    }
    return TD_OK;
}

extern "C" void cuda_mem_free(void *p)
{
    if (p)
        (void)cudaFree(p);
}

/* The bytes of a small upload, carried in the launch's parameters. */
template <size_t N> struct upload_bytes {
    uint32_t w[N / 4];
};

/* Writes the first n bytes of b to dst: 4-byte words where dst and n allow, else bytes. */
template <size_t N>
__global__ void __launch_bounds__(256) upload_kernel(bool early, uint8_t *dst,
                                                     const upload_bytes<N> b, uint32_t n)
{
    pdl_enter(early);
    const uint32_t t = threadIdx.x;
    if ((((uintptr_t)dst | n) & 3) == 0) {
        for (uint32_t i = t; i < n / 4; i += blockDim.x)
            ((uint32_t *)dst)[i] = b.w[i];
        return;
    }
    for (uint32_t i = t; i < n; i += blockDim.x)
        dst[i] = (uint8_t)(b.w[i / 4] >> (8 * (i % 4)));
}

template <size_t N> static td_err upload_small(void *dst, const void *src, size_t bytes,
                                               ops_stream st)
{
    upload_bytes<N> b;
    memset(&b, 0, sizeof b);
    memcpy(&b, src, bytes); /* little-endian words: byte i is bits 8 (i % 4) of word i / 4 */
    return pdl_launch<upload_kernel<N>>("upload to the device", dim3(1), dim3(256), 0, st,
                                        (uint8_t *)dst, b, (uint32_t)bytes);
}

extern "C" td_err cuda_mem_upload(void *dst, const void *src, size_t bytes, ops_stream st)
{
    if (bytes == 0)
        return TD_OK;
    TD_ASSERT(dst != NULL && src != NULL);
    /* Up to CUDA_UPLOAD_INLINE bytes travel in a kernel's parameters: a link of the
     * programmatic chain, taken from src when the call is made, and never a wait of the host
     * for the stream, which cudaMemcpyAsync from pageable memory may be. */
    if (bytes <= 64)
        return upload_small<64>(dst, src, bytes, st);
    if (bytes <= 256)
        return upload_small<256>(dst, src, bytes, st);
    if (bytes <= CUDA_UPLOAD_INLINE)
        return upload_small<CUDA_UPLOAD_INLINE>(dst, src, bytes, st);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st);
    return e == cudaSuccess ? TD_OK : mem_fail(e, "upload to the device", bytes);
}

extern "C" td_err cuda_mem_download(void *dst, const void *src, size_t bytes, ops_stream st)
{
    TD_ASSERT(bytes == 0 || (dst != NULL && src != NULL));
    if (bytes > 0) {
        cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st);
        if (e != cudaSuccess)
            return mem_fail(e, "download from the device", bytes);
    }
    return cuda_stream_sync(st);
}

extern "C" td_err cuda_mem_copy(void *dst, const void *src, size_t bytes, ops_stream st)
{
    if (bytes == 0)
        return TD_OK;
    TD_ASSERT(dst != NULL && src != NULL);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st);
    return e == cudaSuccess ? TD_OK : mem_fail(e, "device copy", bytes);
}

extern "C" td_err cuda_mem_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                                   size_t width, size_t rows, ops_stream st)
{
    if (width == 0 || rows == 0)
        return TD_OK;
    TD_ASSERT(dst != NULL && src != NULL && dpitch >= width && spitch >= width);
    cudaError_t e = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
                                      cudaMemcpyDeviceToDevice, st);
    return e == cudaSuccess ? TD_OK : mem_fail(e, "device 2D copy", width * rows);
}

/* A copy as a kernel: rows of n UNIT pieces (16: uint4, 4: uint32), row r from src + r * sp
 * to dst + r * dp (pitches in pieces); x strides over a row's pieces, y over the rows. */
template <typename UNIT>
__global__ void __launch_bounds__(256) copy_kernel(bool early, UNIT *dst, size_t dp,
                                                   const UNIT *src, size_t sp, size_t n,
                                                   size_t rows)
{
    pdl_enter(early);
    for (size_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x)
            dst[r * dp + i] = src[r * sp + i];
}

#define COPY_KERNEL_MAX ((size_t)64 << 20) /* larger copies: the copy engine */

/* The pieces copy_launch moves rows of width bytes at dst, src with these pitches in: 16
 * bytes where all of them are 16-byte aligned, 4 where 4-byte aligned; 0 (the copy engine's
 * work) otherwise or past COPY_KERNEL_MAX in all. */
static size_t copy_unit(const void *dst, size_t dpitch, const void *src, size_t spitch,
                        size_t width, size_t rows)
{
    const uintptr_t a = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)dpitch |
                        (uintptr_t)spitch | (uintptr_t)width;
    return width > COPY_KERNEL_MAX / rows || (a & 3) != 0 ? 0 : (a & 15) == 0 ? 16 : 4;
}

/* That copy as a programmatic dependent kernel of unit-byte pieces (copy_unit). */
static td_err copy_launch(void *dst, size_t dpitch, const void *src, size_t spitch,
                          size_t width, size_t rows, size_t unit, ops_stream st)
{
    int dev = 0, n_sm = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    TD_TRY(sm_count(dev, &n_sm));
    const size_t n = width / unit;
    const dim3 grid((unsigned)((n + 255) / 256 < (size_t)n_sm ? (n + 255) / 256 : n_sm),
                    (unsigned)(rows < 65535 ? rows : 65535));
    const char *what = rows > 1 ? "device 2D copy" : "device copy";
    if (unit == 16)
        return pdl_launch<copy_kernel<uint4>>(what, grid, dim3(256), 0, st, (uint4 *)dst,
                                              dpitch / 16, (const uint4 *)src, spitch / 16, n,
                                              rows);
    return pdl_launch<copy_kernel<uint32_t>>(what, grid, dim3(256), 0, st, (uint32_t *)dst,
                                             dpitch / 4, (const uint32_t *)src, spitch / 4, n,
                                             rows);
}

extern "C" td_err cuda_mem_copy_chained(void *dst, const void *src, size_t bytes, ops_stream st)
{
    if (bytes == 0)
        return TD_OK;
    TD_ASSERT(dst != NULL && src != NULL);
    const size_t unit = copy_unit(dst, bytes, src, bytes, bytes, 1);
    return unit ? copy_launch(dst, bytes, src, bytes, bytes, 1, unit, st)
                : cuda_mem_copy(dst, src, bytes, st);
}

extern "C" td_err cuda_mem_copy2d_chained(void *dst, size_t dpitch, const void *src,
                                           size_t spitch, size_t width, size_t rows,
                                           ops_stream st)
{
    if (width == 0 || rows == 0)
        return TD_OK;
    TD_ASSERT(dst != NULL && src != NULL && dpitch >= width && spitch >= width);
    const size_t unit = copy_unit(dst, dpitch, src, spitch, width, rows);
    return unit ? copy_launch(dst, dpitch, src, spitch, width, rows, unit, st)
                : cuda_mem_copy2d(dst, dpitch, src, spitch, width, rows, st);
}

extern "C" td_err cuda_mem_fill(void *p, int value, size_t bytes, ops_stream st)
{
    if (bytes == 0)
        return TD_OK;
    TD_ASSERT(p != NULL);
    cudaError_t e = cudaMemsetAsync(p, value, bytes, st);
    return e == cudaSuccess ? TD_OK : mem_fail(e, "device fill", bytes);
}

extern "C" td_err cuda_stream_create(ops_stream *st)
{
    TD_ASSERT(st != NULL);
    cudaStream_t s = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return err_set(TD_ECUDA, "cudaStreamCreate: %s", cudaGetErrorString(e));
    }
    *st = s;
    return TD_OK;
}

extern "C" void cuda_stream_free(ops_stream st)
{
    if (st)
        (void)cudaStreamDestroy(st);
}

extern "C" td_err cuda_stream_sync(ops_stream st)
{
    cudaError_t e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return err_set(TD_ECUDA, "work on the stream failed: %s", cudaGetErrorString(e));
    }
    return TD_OK;
}

td_err stream_buf_get(stream_bufs *t, cudaStream_t st, size_t need, bool grow, void **out,
                      stream_buf **slot)
{
    *out = NULL;
    if (slot)
        *slot = NULL;
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    pthread_mutex_lock(&t->lock);
    stream_buf *s = NULL;
    for (int i = 0; i < STREAM_BUF_SLOTS && !s; i++)
        if (t->slot[i].used && t->slot[i].dev == dev && t->slot[i].st == st)
            s = &t->slot[i];
    for (int i = 0; i < STREAM_BUF_SLOTS && !s; i++)
        if (!t->slot[i].used) {
            s = &t->slot[i];
            *s = stream_buf{dev, st, NULL, 0, true, ~0ull};
        }
    if (!s) {
        pthread_mutex_unlock(&t->lock);
        return err_set(TD_ENOMEM, "%s: buffers for more than %d streams", t->what,
                       STREAM_BUF_SLOTS);
    }
    if (s->cap < need && grow) {
        const size_t cap = (need + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
        if (s->buf)
            (void)cudaFree(s->buf); /* an error here would be a fault of earlier work; the
                                     * allocation below reports what matters */
        s->buf = NULL;
        s->cap = 0;
        const cudaError_t e = cudaMalloc(&s->buf, cap);
        if (e != cudaSuccess) {
            s->buf = NULL;
            (void)cudaGetLastError();
            pthread_mutex_unlock(&t->lock);
            return err_set(TD_ENOMEM, "%s: %zu bytes of device memory: %s", t->what, cap,
                           cudaGetErrorString(e));
        }
        s->cap = cap;
    }
    if (s->cap >= need)
        *out = s->buf;
    if (slot)
        *slot = s;
    pthread_mutex_unlock(&t->lock);
    return TD_OK;
}
