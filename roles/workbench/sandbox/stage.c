/* The processes around bubblewrap, as one small program (roles/workbench/sandbox/stage.py).
 *
 *   sandbox-stage outer ALIVE_FD PROCS KILL LIMITS -- BWRAP ARGS...
 *   sandbox-stage inner ALIVE_FD BACKSTOP_S -- COMMAND ARGS...
 *
 * outer (outside the sandbox, the first process of a run): armed with the parent-death signal
 * (SIGTERM, read as it reads ALIVE_FD's EOF), it forks the child that joins the run's pids cgroup
 * (PROCS: its cgroup.procs, "-" for none), takes the rlimits (LIMITS:
 * "core=0:0,cpu=S:H,as=N:N,fsize=N:N", "-" for none) and execs bubblewrap; it stays outside the
 * cgroup as the watcher. The child's end is this program's end, with its status (128+N for
 * signal N). Once ALIVE_FD (a pipe whose only write end the caller holds) reads EOF, or SIGTERM
 * arrives, while the child runs, the caller died (or the run is to end): the cgroup is killed
 * (KILL: its cgroup.kill, "-" for none; and each member named in PROCS) and so is this process
 * group.
 *
 * inner (inside the sandbox, bubblewrap's command): forks the command, closing ALIVE_FD in it;
 * once ALIVE_FD reads EOF (the caller died) or BACKSTOP_S seconds pass, every process of the
 * sandbox it may signal is killed (kill(-1)). The command's end is this program's end, with its
 * status; a command that cannot be executed ends it with 127 and one line saying why. It refuses
 * to run unless its parent is pid 1 (bubblewrap's first process in the sandbox's own pid
 * namespace): anywhere else kill(-1) would reach the host's processes.
 *
 * Exit 126: the stage could not be set up (bad arguments, the cgroup could not be joined). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
    dprintf(2, "sandbox-stage: %s: %s\n", what, strerror(errno));
    _exit(126);
}

static int status_code(int st) {
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return 126;
}

static int write_text(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    int saved = errno;
    close(fd);
    errno = saved;
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

static int parse_limits(const char *spec) {
    if (strcmp(spec, "-") == 0) return 0;
    char *copy = strdup(spec);
    if (!copy) return -1;
    for (char *item = strtok(copy, ","); item; item = strtok(NULL, ",")) {
        char name[16];
        unsigned long long soft, hard;
        if (sscanf(item, "%15[a-z]=%llu:%llu", name, &soft, &hard) != 3) { free(copy); return -1; }
        int res;
        if (strcmp(name, "core") == 0) res = RLIMIT_CORE;
        else if (strcmp(name, "cpu") == 0) res = RLIMIT_CPU;
        else if (strcmp(name, "as") == 0) res = RLIMIT_AS;
        else if (strcmp(name, "fsize") == 0) res = RLIMIT_FSIZE;
        else { free(copy); return -1; }
        struct rlimit rl = {(rlim_t)soft, (rlim_t)hard};
        if (setrlimit(res, &rl) != 0) { free(copy); return -1; }
    }
    free(copy);
    return 0;
}

/* SIGCHLD, and SIGTERM (the outer stage's parent-death signal), read from a descriptor. */
static int signals_fd(sigset_t *old) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    if (sigprocmask(SIG_BLOCK, &set, old) != 0) die("sigprocmask");
    int fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (fd < 0) die("signalfd");
    return fd;
}

/* Wait for `child` while watching `alive` (EOF: the caller died). `deadline_ms` < 0: no backstop.
 * Returns the child's status code, or -1 when the caller died or the backstop passed. */
static int watch(pid_t child, int alive, int sfd, long long deadline_ms) {
    struct pollfd fds[2] = {{sfd, POLLIN, 0}, {alive, POLLIN, 0}};
    for (;;) {
        int st;
        pid_t got = waitpid(child, &st, WNOHANG);
        if (got == child) return status_code(st);
        if (got < 0 && errno != EINTR) return 126;
        int timeout = -1;
        if (deadline_ms >= 0) {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            long long left = deadline_ms - (now.tv_sec * 1000LL + now.tv_nsec / 1000000);
            if (left <= 0) return -1;
            timeout = left > 60000 ? 60000 : (int)left;
        }
        int n = poll(fds, alive >= 0 ? 2 : 1, timeout);
        if (n < 0 && errno != EINTR) return 126;
        if (n > 0 && fds[0].revents) {
            struct signalfd_siginfo info;
            int ended = 0;
            while (read(sfd, &info, sizeof info) == sizeof info)
                if (info.ssi_signo == SIGTERM) ended = 1;
            if (ended) return -1;
        }
        if (n > 0 && alive >= 0 && fds[1].revents) {
            char buf[64];
            ssize_t r = read(alive, buf, sizeof buf);
            if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) return -1;
        }
    }
}

static void kill_cgroup(const char *procs, const char *killfile) {
    if (strcmp(killfile, "-") != 0) write_text(killfile, "1");   /* cgroup v2: the whole group */
    if (strcmp(procs, "-") == 0) return;
    for (int round = 0; round < 3; round++) {                     /* v1: each member, as it is */
        FILE *f = fopen(procs, "re");
        if (!f) return;
        int pid, any = 0;
        while (fscanf(f, "%d", &pid) == 1) { kill(pid, SIGKILL); any = 1; }
        fclose(f);
        if (!any) return;
    }
}

static int outer(int alive, const char *procs, const char *killfile, const char *limits, char **argv) {
    sigset_t old;
    int sfd = signals_fd(&old);
    /* the caller's death: SIGTERM, read like its EOF on ALIVE_FD (never a SIGKILL here, which
     * would end the watcher before it ends the run); a caller gone already reads EOF at once */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) die("prctl");
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (strcmp(procs, "-") != 0) {
            char pid[32];
            snprintf(pid, sizeof pid, "%d\n", (int)getpid());
            if (write_text(procs, pid) != 0) die("joining the pids cgroup");
        }
        if (parse_limits(limits) != 0) die("setting the resource limits");
        execv(argv[0], argv);
        dprintf(2, "sandbox-stage: cannot execute %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int code = watch(child, alive, sfd, -1);
    if (code >= 0) return code;
    kill_cgroup(procs, killfile);
    kill(0, SIGKILL);                     /* this process group: the child, bubblewrap, and this */
    return 137;
}

static int inner(int alive, long backstop_s, char **argv) {
    sigset_t old;
    int sfd = signals_fd(&old);
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        close(sfd);
        if (alive >= 0) close(alive);
        execvp(argv[0], argv);
        int saved = errno;
        dprintf(2, "%s: %s\n", argv[0], saved == ENOENT ? "command not found" : strerror(saved));
        _exit(saved == ENOENT ? 127 : 126);
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long deadline = now.tv_sec * 1000LL + now.tv_nsec / 1000000 + backstop_s * 1000LL;
    int code = watch(child, alive, sfd, deadline);
    if (code >= 0) return code;
    kill(-1, SIGKILL);                    /* every process of the sandbox but pid 1 and this one */
    return 137;
}

int main(int argc, char **argv) {
    int is_outer = argc > 1 && strcmp(argv[1], "outer") == 0, is_inner = argc > 1 && strcmp(argv[1], "inner") == 0;
    int dash = is_outer ? 6 : 4;          /* after the mode's own arguments, "--", then the program */
    if (!(is_outer || is_inner) || argc < dash + 2 || strcmp(argv[dash], "--") != 0) {
        dprintf(2, "usage: sandbox-stage outer ALIVE_FD PROCS KILL LIMITS -- PROGRAM ARGS...\n"
                   "       sandbox-stage inner ALIVE_FD BACKSTOP_S -- PROGRAM ARGS...\n");
        return 126;
    }
    char *end;
    long alive = strtol(argv[2], &end, 10);
    if (*end || alive < 0 || alive > 1 << 20) {
        dprintf(2, "sandbox-stage: bad descriptor %s\n", argv[2]);
        return 126;
    }
    if (is_outer)   /* kept open across exec: bubblewrap hands it on to the inner stage */
        return outer((int)alive, argv[3], argv[4], argv[5], argv + dash + 1);
    long backstop = strtol(argv[3], &end, 10);
    if (*end || backstop <= 0) {
        dprintf(2, "sandbox-stage: bad backstop %s\n", argv[3]);
        return 126;
    }
    if (getppid() != 1) {
        /* its kill(-1) is the sandbox's whole pid namespace only where its parent is that
         * namespace's first process (bubblewrap's): run anywhere else, it would be the host's */
        dprintf(2, "sandbox-stage: inner runs only as the command of a sandbox's first process\n");
        return 126;
    }
    if (fcntl((int)alive, F_SETFD, FD_CLOEXEC) != 0) {
        kill(-1, SIGKILL);                /* not open: the caller cannot be watched, so nothing runs */
        return 137;
    }
    return inner((int)alive, backstop, argv + dash + 1);
}
