/* tandem serve's MPS control daemon (serve_mps.h). The control program is run with fork +
 * exec and nothing else in between (the supervisor already has NNG threads), in its own
 * process group so that Ctrl-C at the terminal reaches the services but not the daemon,
 * which must outlive its clients. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/serve_mps.h"
#include "common/log.h"

#define MPS_PROGRAM "nvidia-cuda-mps-control"
#define MPS_RUN_WAIT_MS 10000  /* the control program returns at once; killed after this */
#define MPS_SOCKET_WAIT_MS 5000 /* the daemon listens on <pipe>/control within this */
#define MPS_QUIT_WAIT_MS 10000 /* and is gone within this of a quit */
#define MPS_SUN_PATH_MAX 107   /* AF_UNIX path bytes: <pipe>/control must fit */
#define MPS_PID_FILE "nvidia-cuda-mps-control.pid"

static const char PIPE_VAR[] = "CUDA_MPS_PIPE_DIRECTORY";
static const char LOG_VAR[] = "CUDA_MPS_LOG_DIRECTORY";

static void mps_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Whether a control daemon listens on pipe_dir/control. The file alone says nothing: the
 * daemon leaves its socket behind when it quits. The socket is a SOCK_SEQPACKET one (a
 * stream connection is refused with EPROTOTYPE); the daemon logs "Unable to accept
 * connection" for a connection that says nothing, and goes on. */
static bool mps_listening(const char *pipe_dir)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path, sizeof a.sun_path, "%s/control", pipe_dir);
    if (n < 0 || (size_t)n >= sizeof a.sun_path)
        return false;
    static const int types[] = {SOCK_SEQPACKET, SOCK_STREAM};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        int fd = socket(AF_UNIX, types[i] | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return false;
        int rc = connect(fd, (const struct sockaddr *)&a, sizeof a);
        int e = errno;
        close(fd);
        if (rc == 0)
            return true;
        if (e != EPROTOTYPE)
            return false;
    }
    return false;
}

/* Whether the process named by pipe_dir's pid file lives: the daemon writes the file when it
 * starts and removes it when it has quit. */
static bool mps_pid_alive(const char *pipe_dir)
{
    char path[PATH_MAX + sizeof MPS_PID_FILE + 1];
    snprintf(path, sizeof path, "%s/%s", pipe_dir, MPS_PID_FILE);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    long pid = 0;
    if (fscanf(f, "%ld", &pid) != 1)
        pid = 0;
    fclose(f);
    return pid > 0 && pid <= INT_MAX && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

/* The pid file first: a probe connection costs a line in the daemon's log, and a stop waits
 * for the daemon by asking this every 10 ms. */
static bool mps_running(const char *pipe_dir)
{
    return mps_pid_alive(pipe_dir) || mps_listening(pipe_dir);
}

/* Waits up to ms for the daemon of pipe_dir to listen (want true) or to be gone (want false). */
static bool mps_wait(const char *pipe_dir, bool want, int ms)
{
    for (int waited = 0; (want ? mps_listening(pipe_dir) : mps_running(pipe_dir)) != want;
         waited += 10) {
        if (waited >= ms)
            return false;
        mps_sleep_ms(10);
    }
    return true;
}

/* The program's absolute path from PATH (the services' PATH: env is built from ours). */
static bool mps_which(char *out, size_t cap)
{
    const char *path = getenv("PATH");
    if (!path)
        return false;
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        int w = n ? snprintf(out, cap, "%.*s/%s", (int)n, p, MPS_PROGRAM)
                  : snprintf(out, cap, "./%s", MPS_PROGRAM); /* an empty entry is "." */
        if (w > 0 && (size_t)w < cap && access(out, X_OK) == 0)
            return true;
        p += n + (p[n] == ':');
    }
    return false;
}

static bool mps_is_var(const char *entry, const char *var)
{
    size_t n = strlen(var);
    return strncmp(entry, var, n) == 0 && entry[n] == '=';
}

/* env = our environment, without the MPS variables when strip, plus the strings of m->own. */
static td_err mps_env_build(mps_ctl *m, bool strip)
{
    extern char **environ;
    size_t n = 0;
    while (environ[n])
        n++;
    m->env = calloc(n + 3, sizeof *m->env);
    if (!m->env)
        return err_set(TD_ENOMEM, "out of memory");
    m->n_env = 0;
    for (size_t i = 0; i < n; i++)
        if (!strip || (!mps_is_var(environ[i], PIPE_VAR) && !mps_is_var(environ[i], LOG_VAR)))
            m->env[m->n_env++] = environ[i];
    for (int k = 0; k < 2; k++)
        if (m->own[k])
            m->env[m->n_env++] = m->own[k];
    m->env[m->n_env] = NULL;
    return TD_OK;
}

static void mps_env_drop(mps_ctl *m)
{
    free(m->env);
    free(m->own[0]);
    free(m->own[1]);
    m->env = NULL;
    m->own[0] = m->own[1] = NULL;
    m->n_env = 0;
}

/* env naming m's own pipe and log directories (instead of any the user's environment has). */
static td_err mps_env_own(mps_ctl *m)
{
    size_t np = sizeof PIPE_VAR + strlen(m->pipe_dir) + 1;
    size_t nl = sizeof LOG_VAR + strlen(m->log_dir) + 1;
    m->own[0] = malloc(np);
    m->own[1] = malloc(nl);
    if (!m->own[0] || !m->own[1]) {
        mps_env_drop(m);
        return err_set(TD_ENOMEM, "out of memory");
    }
    snprintf(m->own[0], np, "%s=%s", PIPE_VAR, m->pipe_dir);
    snprintf(m->own[1], nl, "%s=%s", LOG_VAR, m->log_dir);
    return mps_env_build(m, true);
}

/* Runs the control program (with arg, or reading input on stdin) in the services'
 * environment, its output appended to m->out_log. Returns its exit status, or -1 when it
 * could not be run or did not finish in time (it is killed then). */
static int mps_control(const mps_ctl *m, const char *exe, const char *arg, const char *input)
{
    int fds[2] = {-1, -1};
    if (input && pipe2(fds, O_CLOEXEC) != 0)
        return -1;
    int out = open(m->out_log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    char *argv[3] = {(char *)exe, (char *)arg, NULL};
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* async-signal-safe calls only until exec */
        setpgid(0, 0);
        int in = input ? fds[0] : open("/dev/null", O_RDONLY);
        if (in >= 0)
            dup2(in, STDIN_FILENO);
        if (out >= 0) {
            dup2(out, STDOUT_FILENO);
            dup2(out, STDERR_FILENO);
        }
        close_range(3, ~0u, 0); /* the supervisor's sockets stay with it, not the daemon */
        execve(exe, argv, m->env);
        _exit(127);
    }
    if (out >= 0)
        close(out);
    if (input) {
        close(fds[0]);
        if (pid > 0) {
            ssize_t w = write(fds[1], input, strlen(input));
            (void)w; /* a program that went away says so in its status (SIGPIPE is ignored) */
        }
        close(fds[1]);
    }
    if (pid < 0)
        return -1;
    int st = 0;
    for (int waited = 0;; waited += 10) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            break;
        if (r < 0)
            return -1;
        if (waited >= MPS_RUN_WAIT_MS) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        mps_sleep_ms(10);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Tells the daemon of m's pipe directory to quit, waits for it to be gone and removes the
 * socket it leaves. */
static void mps_quit(const mps_ctl *m, const char *exe)
{
    char sock[PATH_MAX + 16];
    snprintf(sock, sizeof sock, "%s/control", m->pipe_dir);
    int rc = mps_control(m, exe, NULL, "quit\n");
    if (rc != 0) {
        LOG_WARN("'echo quit | %s' exited with status %d (see %s)", MPS_PROGRAM, rc, m->out_log);
    } else if (!mps_wait(m->pipe_dir, false, MPS_QUIT_WAIT_MS)) {
        LOG_WARN("the MPS control daemon of %s did not quit in %d ms", m->pipe_dir,
                 MPS_QUIT_WAIT_MS);
    } else {
        unlink(sock);
        LOG_INFO("MPS control daemon stopped");
    }
}

static void mps_warn(const mps_ctl *m)
{
    LOG_WARN("running without MPS (%s): verifyd and draftd each hold their own GPU context, so "
             "every draft/verify round trip pays a GPU context switch (about 290 us measured on "
             "an H200, against about 10 us under MPS)", m->why);
}

static int mps_mkdir(const char *path)
{
    return mkdir(path, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

/* Starts a control daemon of our own under run_dir/mps: mode OWN with its environment, or
 * OFF (m->why says why) with the environment left unbuilt. */
static td_err mps_start_own(mps_ctl *m, const char *run_dir)
{
    char base[PATH_MAX], exe[PATH_MAX], sock[PATH_MAX + 16];
    m->mode = MPS_MODE_OFF;
    snprintf(base, sizeof base, "%s/mps", run_dir);
    int a = snprintf(m->pipe_dir, sizeof m->pipe_dir, "%s/pipe", base);
    int b = snprintf(m->log_dir, sizeof m->log_dir, "%s/log", base);
    if (a < 0 || b < 0 || (size_t)a >= sizeof m->pipe_dir || (size_t)b >= sizeof m->log_dir ||
        strlen(m->pipe_dir) + strlen("/control") > MPS_SUN_PATH_MAX) {
        snprintf(m->why, sizeof m->why, "the pipe directory under %s is too long for a UNIX "
                 "socket path of %d bytes", run_dir, MPS_SUN_PATH_MAX);
        return TD_OK;
    }
    if (mps_mkdir(base) || mps_mkdir(m->pipe_dir) || mps_mkdir(m->log_dir)) {
        snprintf(m->why, sizeof m->why, "cannot create %s: %s", base, strerror(errno));
        return TD_OK;
    }
    if (!mps_which(exe, sizeof exe)) {
        snprintf(m->why, sizeof m->why, "%s is not on PATH", MPS_PROGRAM);
        return TD_OK;
    }
    TD_TRY(mps_env_own(m));
    snprintf(sock, sizeof sock, "%s/control", m->pipe_dir);
    if (mps_running(m->pipe_dir)) {
        /* An earlier supervisor of this runtime directory was killed before it could stop
         * its daemon (this one holds the control socket, so no other runs here). */
        LOG_WARN("an MPS control daemon was left in %s; telling it to quit", m->pipe_dir);
        mps_quit(m, exe);
    }
    int rc = mps_control(m, exe, "-d", NULL);
    if (rc < 0)
        snprintf(m->why, sizeof m->why, "%s -d could not run or did not return in %d ms; its "
                 "output is in %s", MPS_PROGRAM, MPS_RUN_WAIT_MS, m->out_log);
    else if (rc != 0)
        snprintf(m->why, sizeof m->why, "%s -d exited with status %d; its output is in %s",
                 MPS_PROGRAM, rc, m->out_log);
    else if (!mps_wait(m->pipe_dir, true, MPS_SOCKET_WAIT_MS)) {
        snprintf(m->why, sizeof m->why, "%s -d left no daemon listening on %s in %d ms; see %s "
                 "and %s/control.log", MPS_PROGRAM, sock, MPS_SOCKET_WAIT_MS, m->out_log,
                 m->log_dir);
        m->late = true; /* it may yet come up */
    } else
        m->mode = MPS_MODE_OWN;
    if (m->mode != MPS_MODE_OWN)
        mps_env_drop(m);
    return TD_OK;
}

td_err mps_start(mps_ctl *m, const char *run_dir, const char *logs_dir)
{
    memset(m, 0, sizeof *m);
    snprintf(m->out_log, sizeof m->out_log, "%s/mps.log", logs_dir);
    TD_TRY(mps_start_own(m, run_dir));
    if (m->mode == MPS_MODE_OWN)
        return TD_OK;
    if (!m->late)
        m->pipe_dir[0] = m->log_dir[0] = '\0';
    return mps_env_build(m, true);
}

td_err mps_init(mps_ctl *m, bool gpu, bool no_mps, const char *run_dir, const char *logs_dir)
{
    memset(m, 0, sizeof *m);
    snprintf(m->out_log, sizeof m->out_log, "%s/mps.log", logs_dir);
    const char *user = getenv(PIPE_VAR);
    if (!gpu) {
        m->mode = MPS_MODE_UNUSED;
        return mps_env_build(m, false);
    }
    if (no_mps) {
        /* The services must not become clients of a daemon the environment names either. */
        m->mode = MPS_MODE_OFF;
        snprintf(m->why, sizeof m->why, "--no-mps");
        mps_warn(m);
        return mps_env_build(m, true);
    }
    if (user && *user) {
        m->mode = MPS_MODE_USER;
        snprintf(m->pipe_dir, sizeof m->pipe_dir, "%s", user);
        if (!mps_listening(user)) {
            snprintf(m->why, sizeof m->why, "no daemon listened on %s/control when serve "
                     "started", user);
            LOG_WARN("%s=%s names no running MPS control daemon (none listens on %s/control): "
                     "the services run without MPS until one starts there, and each "
                     "draft/verify round trip pays a GPU context switch (about 290 us on an "
                     "H200, about 10 us under MPS)", PIPE_VAR, user, user);
        } else {
            LOG_INFO("MPS: the services are clients of the control daemon of %s=%s (not "
                     "started or stopped here)", PIPE_VAR, user);
        }
        return mps_env_build(m, false);
    }
    TD_TRY(mps_start(m, run_dir, logs_dir));
    if (m->mode == MPS_MODE_OFF) {
        mps_warn(m);
        return TD_OK;
    }
    LOG_INFO("MPS control daemon started; the GPU services are its clients (pipes in %s, its "
             "logs in %s)", m->pipe_dir, m->log_dir);
    return TD_OK;
}

/* A daemon started by mps_start_own that came up after its wait gave up has no clients (the
 * services were started without MPS), but would outlive us: it is told to quit like our own. */
static void mps_stop_late(mps_ctl *m)
{
    char exe[PATH_MAX];
    if (!mps_running(m->pipe_dir) || !mps_which(exe, sizeof exe))
        return;
    mps_env_drop(m);
    if (mps_env_own(m) != TD_OK)
        return;
    LOG_WARN("the MPS control daemon of %s came up after serve went on without it; telling it "
             "to quit", m->pipe_dir);
    mps_quit(m, exe);
}

void mps_free(mps_ctl *m)
{
    if (m->mode == MPS_MODE_OFF && m->late) {
        mps_stop_late(m);
        m->late = false;
    }
    if (m->mode == MPS_MODE_OWN) {
        char exe[PATH_MAX];
        if (mps_which(exe, sizeof exe))
            mps_quit(m, exe);
        else
            LOG_WARN("%s is no longer on PATH: the MPS control daemon of %s keeps running",
                     MPS_PROGRAM, m->pipe_dir);
        m->mode = MPS_MODE_OFF;
    }
    mps_env_drop(m);
}

void mps_describe(const mps_ctl *m, char *out, size_t cap)
{
    switch (m->mode) {
    case MPS_MODE_UNUSED:
        snprintf(out, cap, "not used (the services run on the CPU)");
        break;
    case MPS_MODE_OWN:
        snprintf(out, cap, "in use: control daemon started by tandem serve, pipes in %s",
                 m->pipe_dir);
        break;
    case MPS_MODE_USER:
        snprintf(out, cap, "in use: the user's control daemon, pipes in %s%s%s%s", m->pipe_dir,
                 m->why[0] ? " (" : "", m->why, m->why[0] ? ")" : "");
        break;
    case MPS_MODE_OFF:
        snprintf(out, cap, "off (%s): each draft/verify round trip pays a GPU context switch",
                 m->why);
        break;
    }
}
