#include "tests/support/spawn.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SPAWN_CHILD_FLAG "--spawn-child"

int spawn_self(const char *mode, int *sock, pid_t *pid)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    char fdstr[16];
    snprintf(fdstr, sizeof fdstr, "%d", sv[1]);
    /* Flush so buffered test output is not written twice. */
    fflush(stdout);
    fflush(stderr);
    pid_t p = fork();
    if (p < 0) {
        int e = errno;
        close(sv[0]);
        close(sv[1]);
        errno = e;
        return -1;
    }
    if (p == 0) {
        /* Only the child's end survives exec. */
        fcntl(sv[1], F_SETFD, 0);
        execl("/proc/self/exe", "spawned-child", SPAWN_CHILD_FLAG, mode, fdstr, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    *sock = sv[0];
    *pid = p;
    return 0;
}

int spawn_is_child(int argc, char **argv, const char **mode, int *sock)
{
    if (argc != 4 || strcmp(argv[1], SPAWN_CHILD_FLAG) != 0)
        return 0;
    *mode = argv[2];
    *sock = atoi(argv[3]);
    /* Keep the socket from leaking into anything the child starts in turn. */
    fcntl(*sock, F_SETFD, FD_CLOEXEC);
    return 1;
}

int spawn_wait(pid_t pid, int timeout_ms)
{
    for (int waited = 0;; waited += 5) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (r < 0 && errno != EINTR)
            return -1;
        if (waited >= timeout_ms) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int spawn_fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory stream's own fd */
}
