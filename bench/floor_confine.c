/* The floor's confinement: one native call, from what the warm parent prepared once (bench/floor_job.py).
 *
 * rlimits, the parent-death signal, no_new_privs, Landlock (a ruleset the parent built from the runtime's
 * rules), and the product's own main seccomp program with its listener. Returns the listener, or -errno. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif

static int limit(int resource, long value) {
    struct rlimit bound = {(rlim_t)value, (rlim_t)value};
    return setrlimit(resource, &bound);
}

int floor_confine(int ruleset, const struct sock_fprog *program, long memory, long cpu_seconds, long file_size,
                  long open_files) {
    if (limit(RLIMIT_DATA, memory) || limit(RLIMIT_CPU, cpu_seconds) || limit(RLIMIT_FSIZE, file_size) ||
        limit(RLIMIT_NOFILE, open_files) || limit(RLIMIT_CORE, 0))
        return -errno;
    if (prctl(PR_SET_PDEATHSIG, 9) || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        return -errno;
    if (syscall(SYS_landlock_restrict_self, ruleset, 0))
        return -errno;
    close(ruleset);
    long listener = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, program);
    return listener < 0 ? -errno : (int)listener;
}
