/* Tests that need two real processes: the test binary starts itself again (fork + exec, so
 * the child is a fresh process: no inherited CUDA context or NNG state) in a child mode,
 * connected to the parent by an AF_UNIX SOCK_SEQPACKET socket that fdpass can use. */
#ifndef TANDEM_TESTS_SUPPORT_SPAWN_H
#define TANDEM_TESTS_SUPPORT_SPAWN_H

#include <sys/types.h>

/* Starts "<this binary> --spawn-child <mode> <fd>"; *sock is the parent's end of the
 * socket. Returns 0, or -1 with errno set. */
int spawn_self(const char *mode, int *sock, pid_t *pid);

/* In main(), before anything else: returns 1 when this process is a spawned child and
 * sets *mode and *sock (the child's end) from argv; 0 otherwise. */
int spawn_is_child(int argc, char **argv, const char **mode, int *sock);

/* Waits for the child: its exit status, 128 + signal number when killed, or -1 if it did
 * not end within timeout_ms (it is then killed and reaped). */
int spawn_wait(pid_t pid, int timeout_ms);

/* Number of open file descriptors of this process (from /proc/self/fd). */
int spawn_fd_count(void);

#endif
