/* What the guest's seccomp filter answers to one system call, without the call ever running.
 *
 * Each argument is a probe, ABI:NR:ARG0, where ABI is native (x86_64's table), x32 (NR with
 * the x32 bit set by the caller) or i386 (int 0x80). For each, a child process stacks a filter
 * of its own that answers SECCOMP_RET_TRACE to that call (to every i386 and x32 call), then
 * makes the call. With no tracer, RET_TRACE fails the call with ENOSYS before it runs. A filter
 * already in place (the guest's) wins where its action takes precedence (seccomp(2): KILL, then
 * ERRNO, then TRACE), so the child sees:
 *   - the guest filter's errno (EPERM) where the guest filter refuses the call,
 *   - death by SIGSYS where the guest filter kills it,
 *   - ENOSYS where the guest filter lets the call through (nothing ran: the probe's TRACE).
 * ABI clone3 is made without the probe's filter (clone3(NULL, 0): EINVAL from the kernel,
 * ENOSYS from the guest filter) and ABI clone passes ARG0 as clone's flags.
 *
 * One line per probe on stdout: "ABI:NR:ARG0 exit N" (the call's errno, 0 if it returned
 * >= 0) or "ABI:NR:ARG0 signal N". Built by tests/local/test_seccomp.py; x86_64 only. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define X32_SYSCALL_BIT 0x40000000u

static int stack_trace_filter(unsigned int nr)
{
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE), /* i386 */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE),
    };
    struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

static long int80(long nr, long arg0)
{
    long ret;
    __asm__ volatile("int $0x80"
                     : "=a"(ret)
                     : "a"(nr), "b"(arg0), "c"(0L), "d"(0L), "S"(0L), "D"(0L)
                     : "memory");
    return ret;
}

/* In the child: make the call, exit with its errno (0 if it returned >= 0). */
static void call(const char *abi, unsigned long nr, unsigned long arg0)
{
    long ret;
    if (strcmp(abi, "clone3") != 0 && stack_trace_filter((unsigned int)nr) != 0)
        _exit(250); /* not an errno: the probe could not stack its filter */
    errno = 0;
    if (strcmp(abi, "i386") == 0) {
        ret = int80((long)nr, (long)arg0);
        _exit(ret < 0 && ret > -4096 ? (int)-ret : 0);
    }
    ret = syscall((long)nr, arg0, 0L, 0L, 0L, 0L, 0L);
    if (ret == 0 && strcmp(abi, "clone") == 0)
        _exit(0); /* a clone that ran: the new child leaves at once */
    _exit(ret < 0 ? errno : 0);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        char abi[16];
        unsigned long nr, arg0;
        int status;
        if (sscanf(argv[i], "%15[a-z0-9]:%lu:%lu", abi, &nr, &arg0) != 3) {
            fprintf(stderr, "bad probe %s\n", argv[i]);
            return 2;
        }
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 2;
        }
        if (pid == 0)
            call(abi, nr, arg0);
        while (waitpid(pid, &status, 0) < 0)
            if (errno != EINTR) {
                perror("waitpid");
                return 2;
            }
        if (WIFSIGNALED(status))
            printf("%s signal %d\n", argv[i], WTERMSIG(status));
        else
            printf("%s exit %d\n", argv[i], WEXITSTATUS(status));
    }
    return 0;
}
