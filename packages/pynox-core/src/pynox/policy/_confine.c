/* The child's whole confinement in one call: job/setup.py's CONFINE steps after the first, in their order.
 *
 * confine(name, stop_before, call): call is the tuple the template laid out before the fork (policy.native_call),
 * so the child touches one prepared object rather than building its arguments (each object a child touches
 * has its reference count written: a copy-on-write fault per page).
 *
 * Everything is prepared by Python, most of it once in the template (policy/native.py): the seccomp programs
 * libseccomp compiled, the runtime's Landlock rules (descriptors and rights), the descriptor moves and the
 * limits. This file only makes the system calls, so a child writes almost none of the template's pages (a
 * Python step writes the objects it touches, and every written page is a copy-on-write fault). The rules
 * it enforces are exactly those of the Python steps, which stay as the fallback (PYNOX_NATIVE=0); the test
 * tests/sandbox/test_native_confine.py reads both paths' results from outside and compares them.
 *
 * stop_before: a stage whose check Python made before the call and saw fail; the stages before it are made
 * and nothing from it on, so the child is left as the Python steps would leave it.
 *
 * confine(...) returns None once every step is done, or (stage, errno, what) for the first that failed:
 * stage is the index in setup.CONFINE of the step it belongs to, so the failure names the same step as the
 * Python path would. Nothing after a failed call runs: the caller never runs the job's code. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif
#ifndef SYS_landlock_add_rule
#define SYS_landlock_add_rule 445
#endif
#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SECCOMP_FILTER_FLAG_NEW_LISTENER
#define SECCOMP_FILTER_FLAG_NEW_LISTENER (1UL << 3)
#endif
#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

/* The stages, as indices of job/setup.py's CONFINE (0, clearing the exit hooks, stays in Python). */
/* TAKE_INTERRUPTS is Python's own state (a session's handler for the pool's interrupt signal, and its unblocking):
   job/native_setup.py takes it before the call; a failure there stops the call at that stage. */
enum {
    FIRST_TO_BE_KILLED = 1, DIE_WITH_TEMPLATE, NAME, NEW_SESSION, TAKE_INTERRUPTS, BUILD_RULESET, ARRANGE,
    APPLY_POLICY, HAND_OVER
};

#define MAX_ITEMS 512
#define LANDLOCK_RULE_PATH_BENEATH 1
#define CAPABILITY_VERSION_3 0x20080522

struct ruleset_attr {
    uint64_t handled_access_fs, handled_access_net, scoped;
};
struct path_beneath {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));
struct cap_header {
    uint32_t version;
    int pid;
};
struct cap_data {
    uint32_t effective, permitted, inheritable;
};

struct failure {
    int stage, err;
    const char *what;
};

static int fail(struct failure *f, int stage, const char *what) {
    f->stage = stage;
    f->err = errno;
    f->what = what;
    return -1;
}

/* Whether seq is a tuple or list of at most MAX_ITEMS rows, each an int (n == 1) or a tuple of n ints, all of
 * their exact types: then reading it runs no Python code (nothing can change it meanwhile) and needs no new
 * reference. Only reads: a reference count written here is a page the child copies (see int_rows). */
static int plain_rows(PyObject *seq, int n) {
    if (!PyTuple_CheckExact(seq) && !PyList_CheckExact(seq))
        return 0;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count > MAX_ITEMS)
        return 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(seq, i);
        if (n == 1) {
            if (!PyLong_CheckExact(row))
                return 0;
            continue;
        }
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != n)
            return 0;
        for (int j = 0; j < n; j++)
            if (!PyLong_CheckExact(PyTuple_GET_ITEM(row, j)))
                return 0;
    }
    return 1;
}

/* A sequence of n-tuples of integers into out[count][n]; -1 with a Python exception when it is not one.
 * A plain one (see plain_rows, what the template lays out) is read through borrowed references: the child runs
 * this on the template's objects, and each Py_INCREF/Py_DECREF would write (copy) the page its object is on. */
static Py_ssize_t int_rows(PyObject *seq, int n, long long (*out)[3], const char *what) {
    if (plain_rows(seq, n)) {
        Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *row = PySequence_Fast_GET_ITEM(seq, i);
            for (int j = 0; j < n; j++) {
                out[i][j] = PyLong_AsLongLong(n == 1 ? row : PyTuple_GET_ITEM(row, j));
                if (out[i][j] == -1 && PyErr_Occurred())
                    return -1;
            }
        }
        return count;
    }
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL)
        return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
    if (count > MAX_ITEMS) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s: more than %d entries", what, MAX_ITEMS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(fast, i);
        for (int j = 0; j < n; j++) {
            PyObject *item = n == 1 ? row : (PyTuple_Check(row) && PyTuple_GET_SIZE(row) == n ? PyTuple_GET_ITEM(row, j) : NULL);
            if (item == NULL) {
                Py_DECREF(fast);
                PyErr_Format(PyExc_TypeError, "%s: each entry is a tuple of %d integers", what, n);
                return -1;
            }
            out[i][j] = PyLong_AsLongLong(item);
            if (out[i][j] == -1 && PyErr_Occurred()) {
                Py_DECREF(fast);
                return -1;
            }
        }
    }
    Py_DECREF(fast);
    return count;
}

static int add_rule(int ruleset, int fd, uint64_t rights) {
    struct path_beneath rule = {rights, fd};
    return (int)syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
}

static int set_limit(int resource, long long soft, long long hard) {
    struct rlimit bound = {(rlim_t)soft, (rlim_t)hard};
    return setrlimit(resource, &bound);
}

/* Close every descriptor but the targets marked in used[] (numbers below staging): each run of unused numbers below
 * staging in one close_range, then everything from staging to last (the staged copies among them); one close each
 * where close_range is missing (before Linux 5.9). The arrangement's end, in confine and in take_job. */
static void close_all_but(const char *used, int staging, int last) {
    for (int fd = 0; fd < staging;) {
        if (used[fd]) {
            fd++;
            continue;
        }
        int end = fd;
        while (end + 1 < staging && !used[end + 1])
            end++;
        if (syscall(SYS_close_range, fd, end, 0) < 0)
            for (int each = fd; each <= end; each++)
                close(each);
        fd = end + 1;
    }
    if (syscall(SYS_close_range, staging, last, 0) < 0)
        for (int fd = staging; fd <= last; fd++)
            close(fd);
}

static PyObject *confine(PyObject *self, PyObject *args) {
    (void)self;
    int parent_pid, exit_status, ruleset_target, staging, max_fd, uid, gid, handover, keep_handover, stop_before;
    const char *name, *cwd;
    unsigned long long handled_fs, handled_net, scoped, file_rights;
    unsigned long securebits;
    Py_ssize_t attr_size;
    PyObject *prepared_seq, *fitted_seq, *entries_seq, *moves_seq, *null_read_seq, *null_write_seq, *limits_seq,
        *patches_seq;
    struct {
        const char *buf;
        Py_ssize_t len;
    } main_filter, own_filter;
    PyObject *call, *cwd_bytes, *main_bytes, *own_bytes;
    /* The call's tuple parsed as a tuple of its own, not as a nested format: a nested one takes (and drops) a new
     * reference to each of its ~28 items, writing the page of each (copy-on-write faults, ~12 a child); a tuple
     * parsed at the top borrows them. Its bytes as S (borrowed), not y: y takes a buffer, a reference written. */
    if (!PyArg_ParseTuple(args, "yiO!", &name, &stop_before, &PyTuple_Type, &call) ||
        !PyArg_ParseTuple(call, "iiKKKnOOKOOiOOiiOSiikSSOip", &parent_pid, &exit_status, &handled_fs, &handled_net,
                          &scoped, &attr_size, &prepared_seq, &fitted_seq, &file_rights, &entries_seq, &moves_seq,
                          &ruleset_target, &null_read_seq, &null_write_seq, &staging, &max_fd, &limits_seq,
                          &cwd_bytes, &uid, &gid, &securebits, &main_bytes, &own_bytes, &patches_seq, &handover,
                          &keep_handover))
        return NULL;
    cwd = PyBytes_AS_STRING(cwd_bytes);
    if (strlen(cwd) != (size_t)PyBytes_GET_SIZE(cwd_bytes)) {
        PyErr_SetString(PyExc_ValueError, "the working directory: embedded null byte");
        return NULL;
    }
    main_filter.buf = PyBytes_AS_STRING(main_bytes);
    main_filter.len = PyBytes_GET_SIZE(main_bytes);
    own_filter.buf = PyBytes_AS_STRING(own_bytes);
    own_filter.len = PyBytes_GET_SIZE(own_bytes);

    /* Everything read from Python before the first system call, so a malformed argument changes nothing. The
     * rows of every kind one after another in one array: what a call uses (a few dozen rows) is then on one or
     * two pages, each a fault in a child the first time it is written, where an array per kind was seven. */
    static long long rows[7 * MAX_ITEMS][3];
    long long (*next)[3] = rows;
    static char entry_names[64][32], own_directory[32];
    static uint64_t entry_rights[64];
    static struct sock_filter own_program[4096], main_program[4096];
    Py_ssize_t n_prepared, n_fitted, n_moves, n_null_read, n_null_write, n_limits, n_patches, n_entries = 0;
    long long(*prepared)[3], (*fitted)[3], (*moves)[3], (*null_read)[3], (*null_write)[3], (*limits)[3],
        (*patches)[3];
    PyObject *result = NULL;
    /* Each at most MAX_ITEMS rows (int_rows): seven of them fit. */
    if ((n_prepared = int_rows(prepared_seq, 2, prepared = next, "prepared rules")) < 0 ||
        (n_fitted = int_rows(fitted_seq, 2, fitted = next += n_prepared, "granted rules")) < 0 ||
        (n_moves = int_rows(moves_seq, 2, moves = next += n_fitted, "moves")) < 0 ||
        (n_null_read = int_rows(null_read_seq, 1, null_read = next += n_moves, "read-only /dev/null targets")) < 0 ||
        (n_null_write = int_rows(null_write_seq, 1, null_write = next += n_null_read,
                                 "writable /dev/null targets")) < 0 ||
        (n_limits = int_rows(limits_seq, 3, limits = next += n_null_write, "limits")) < 0 ||
        (n_patches = int_rows(patches_seq, 2, patches = next += n_limits, "patches")) < 0)
        goto out;
    if (main_filter.len % sizeof(struct sock_filter) || own_filter.len % sizeof(struct sock_filter) ||
        (size_t)own_filter.len > sizeof(own_program) || (size_t)main_filter.len > sizeof(main_program) ||
        attr_size > (Py_ssize_t)sizeof(struct ruleset_attr) ||
        n_moves + 1 + n_null_read + n_null_write > MAX_ITEMS) {
        PyErr_SetString(PyExc_ValueError, "a program, the ruleset attribute or the moves are out of bounds");
        goto out;
    }
    {
        /* A tuple (as laid out) is immutable: borrowed, as the rows are (int_rows). */
        int borrowed = PyTuple_CheckExact(entries_seq);
        PyObject *fast = borrowed ? entries_seq : PySequence_Fast(entries_seq, "own /proc entries");
        if (fast == NULL)
            goto out;
        n_entries = PySequence_Fast_GET_SIZE(fast);
        snprintf(own_directory, sizeof(own_directory), "/proc/%d", getpid());
        for (Py_ssize_t i = 0; i < n_entries && i < 64; i++) {
            PyObject *entry_bytes;
            unsigned long long rights;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "SK", &entry_bytes, &rights) ||
                strlen(PyBytes_AS_STRING(entry_bytes)) != (size_t)PyBytes_GET_SIZE(entry_bytes)) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "an own /proc entry: embedded null byte");
                if (!borrowed)
                    Py_DECREF(fast);
                goto out;
            }
            const char *entry = PyBytes_AS_STRING(entry_bytes);
            if (strlen(entry) >= sizeof(entry_names[i]) || strchr(entry, '/') != NULL) {
                if (!borrowed)
                    Py_DECREF(fast);
                PyErr_SetString(PyExc_ValueError, "an own /proc entry is one short name");
                goto out;
            }
            strcpy(entry_names[i], entry);
            entry_rights[i] = rights;
        }
        if (!borrowed)
            Py_DECREF(fast);
        if (n_entries > 64) {
            PyErr_SetString(PyExc_ValueError, "too many own /proc entries");
            goto out;
        }
    }

    struct failure f = {0, 0, NULL};
    int ruleset = -1, listener = -1, n_entry_fds = 0;
    static int entry_fds[65];
    char comm[16] = {0};

    /* be the first to be killed */
    int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (oom < 0) {
        fail(&f, FIRST_TO_BE_KILLED, "/proc/self/oom_score_adj");
        goto failed;
    }
    if (write(oom, "1000", 4) < 0) {
        fail(&f, FIRST_TO_BE_KILLED, "/proc/self/oom_score_adj");
        close(oom);
        goto failed;
    }
    close(oom);

    /* die with the template; one that died before the ask sent no signal: exit, reporting nothing */
    if (prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)) {
        fail(&f, DIE_WITH_TEMPLATE, "PR_SET_PDEATHSIG");
        goto failed;
    }
    if (getppid() != parent_pid)
        _exit(exit_status);

    /* name the process */
    strncpy(comm, name, sizeof(comm) - 1);
    if (prctl(PR_SET_NAME, (unsigned long)comm, 0, 0, 0)) {
        fail(&f, NAME, "PR_SET_NAME");
        goto failed;
    }

    /* start a new session */
    if (setsid() < 0) {
        fail(&f, NEW_SESSION, "setsid");
        goto failed;
    }

    /* build the Landlock ruleset, while the grant descriptors are still open */
    if (stop_before == TAKE_INTERRUPTS || stop_before == BUILD_RULESET)
        goto stopped;
    {
        struct ruleset_attr attr = {handled_fs, handled_net, scoped};
        ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, (size_t)attr_size, 0);
        if (ruleset < 0) {
            fail(&f, BUILD_RULESET, "landlock_create_ruleset");
            goto failed;
        }
        for (Py_ssize_t i = 0; i < n_prepared; i++)
            if (add_rule(ruleset, (int)prepared[i][0], (uint64_t)prepared[i][1])) {
                fail(&f, BUILD_RULESET, "landlock_add_rule");
                goto failed;
            }
        for (Py_ssize_t i = 0; i < n_fitted; i++) {
            /* A file takes fewer rights than a directory (landlock.fitting). */
            struct stat info;
            if (fstat((int)fitted[i][0], &info)) {
                fail(&f, BUILD_RULESET, "fstat of a granted path");
                goto failed;
            }
            uint64_t rights = S_ISDIR(info.st_mode) ? (uint64_t)fitted[i][1] : (uint64_t)fitted[i][1] & file_rights;
            if (add_rule(ruleset, (int)fitted[i][0], rights)) {
                fail(&f, BUILD_RULESET, "landlock_add_rule");
                goto failed;
            }
        }
        /* Each entry opened beneath its /proc/<pid>, opened once: one walk of /proc and the pid, not one per
           entry (the rules name the same inodes). These descriptors are left to the arrangement below, which
           closes every descriptor it does not put in place (one close_range, not a close each); a stop or a
           failure before it closes them here. */
        if (n_entries) {
            int own = open(own_directory, O_PATH | O_DIRECTORY | O_CLOEXEC);
            if (own < 0) {
                fail(&f, BUILD_RULESET, "open of an own /proc entry");
                goto failed;
            }
            entry_fds[n_entry_fds++] = own;
            for (Py_ssize_t i = 0; i < n_entries; i++) {
                int fd = openat(own, entry_names[i], O_PATH | O_CLOEXEC);
                if (fd < 0) {
                    if (errno == ENOENT)
                        continue;
                    fail(&f, BUILD_RULESET, "open of an own /proc entry");
                    goto failed;
                }
                entry_fds[n_entry_fds++] = fd;
                if (add_rule(ruleset, fd, entry_rights[i])) {
                    fail(&f, BUILD_RULESET, "landlock_add_rule");
                    goto failed;
                }
            }
        }
    }

    /* arrange descriptors: each source staged above every target first, then put at its number; every other
       descriptor closed (setup.arrange) */
    if (stop_before == ARRANGE)
        goto stopped;
    {
        static int staged[MAX_ITEMS], targets[MAX_ITEMS];
        static char used[MAX_ITEMS];
        Py_ssize_t n = 0;
        for (Py_ssize_t i = 0; i < n_moves; i++, n++) {
            targets[n] = (int)moves[i][1];
            if ((staged[n] = fcntl((int)moves[i][0], F_DUPFD, staging)) < 0) {
                fail(&f, ARRANGE, "F_DUPFD");
                goto failed;
            }
        }
        targets[n] = ruleset_target;
        if ((staged[n++] = fcntl(ruleset, F_DUPFD, staging)) < 0) {
            fail(&f, ARRANGE, "F_DUPFD");
            goto failed;
        }
        /* /dev/null opened once for reading and once for writing, each staged as many times as it is wanted
           (a descriptor of its own each, as an open each would give). */
        int nulls[2] = {-1, -1};
        for (Py_ssize_t i = 0; i < n_null_read + n_null_write; i++, n++) {
            int reading = i < n_null_read;
            if (nulls[reading] < 0 && (nulls[reading] = open("/dev/null", reading ? O_RDONLY : O_WRONLY)) < 0) {
                fail(&f, ARRANGE, "/dev/null");
                if (nulls[!reading] >= 0)
                    close(nulls[!reading]);
                goto failed;
            }
            targets[n] = (int)(reading ? null_read[i][0] : null_write[i - n_null_read][0]);
            staged[n] = fcntl(nulls[reading], F_DUPFD, staging);
            if (staged[n] < 0) {
                fail(&f, ARRANGE, "F_DUPFD");
                for (int j = 0; j < 2; j++)
                    if (nulls[j] >= 0)
                        close(nulls[j]);
                goto failed;
            }
        }
        for (int j = 0; j < 2; j++)
            if (nulls[j] >= 0)
                close(nulls[j]);
        /* From here the entries' descriptors are the arrangement's to close: one may sit at a target's number,
           which a dup2 replaces (a failure from here leaves them to the child's exit; no job code runs). */
        n_entry_fds = 0;
        memset(used, 0, sizeof(used));
        for (Py_ssize_t i = 0; i < n; i++) {
            if (dup2(staged[i], targets[i]) < 0) {
                fail(&f, ARRANGE, "dup2");
                goto failed;
            }
            if (targets[i] >= 0 && targets[i] < staging && targets[i] < MAX_ITEMS)
                used[targets[i]] = 1;
        }
        close_all_but(used, staging, max_fd - 1);
        ruleset = ruleset_target;
    }

    /* apply the policy: rlimits, working directory, identity, no privileges, Landlock, seccomp (the
       environment and SIGXFSZ are Python's: os.environ and the signal module keep their own views) */
    if (stop_before == APPLY_POLICY)
        goto stopped;
    for (Py_ssize_t i = 0; i < n_limits; i++)
        if (set_limit((int)limits[i][0], limits[i][1], limits[i][2])) {
            fail(&f, APPLY_POLICY, "setrlimit");
            goto failed;
        }
    if (chdir(cwd)) {
        fail(&f, APPLY_POLICY, "chdir");
        goto failed;
    }
    if (uid >= 0) {
        if (setgroups(0, NULL) || setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) ||
            setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid)) {
            fail(&f, APPLY_POLICY, "switch user");
            goto failed;
        }
    }
    /* After any credential change, which clears it: the job dies with its template. */
    if (prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)) {
        fail(&f, APPLY_POLICY, "PR_SET_PDEATHSIG");
        goto failed;
    }
    if (geteuid() == 0 && prctl(PR_SET_SECUREBITS, securebits, 0, 0, 0)) {
        fail(&f, APPLY_POLICY, "PR_SET_SECUREBITS");
        goto failed;
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)) {
        fail(&f, APPLY_POLICY, "clear ambient capabilities");
        goto failed;
    }
    {
        struct cap_header header = {CAPABILITY_VERSION_3, 0};
        struct cap_data data[2];
        memset(data, 0, sizeof(data));
        if (syscall(SYS_capset, &header, data)) {
            fail(&f, APPLY_POLICY, "capset");
            goto failed;
        }
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) {
        fail(&f, APPLY_POLICY, "PR_SET_NO_NEW_PRIVS");
        goto failed;
    }
    if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)) {
        fail(&f, APPLY_POLICY, "PR_SET_DUMPABLE");
        goto failed;
    }
    if (syscall(SYS_landlock_restrict_self, ruleset, 0)) {
        fail(&f, APPLY_POLICY, "landlock_restrict_self");
        goto failed;
    }
    close(ruleset);
    ruleset = -1;
    /* The main filter; with no own-process filter beside it, the own-process filter is merged in it
       (OwnProcessFilter.before): this process's pid is written where it goes, and it is the only filter. */
    int pid = getpid();
    {
        size_t count = main_filter.len / sizeof(struct sock_filter);
        memcpy(main_program, main_filter.buf, main_filter.len);
        for (Py_ssize_t i = 0; own_filter.len == 0 && i < n_patches; i++) {
            long long index = patches[i][0];
            if (index >= 0 && (size_t)index < count)
                main_program[index].k = patches[i][1] ? (uint32_t)(-pid) : (uint32_t)pid;
        }
        struct sock_fprog program = {(unsigned short)count, main_program};
        listener = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &program);
        if (listener < 0) {
            fail(&f, APPLY_POLICY, "seccomp filter");
            goto failed;
        }
    }
    if (own_filter.len > 0) {
        /* The own-process filter, with this process's pid written where it goes (own_process.py). */
        size_t count = own_filter.len / sizeof(struct sock_filter);
        memcpy(own_program, own_filter.buf, own_filter.len);
        for (Py_ssize_t i = 0; i < n_patches; i++) {
            long long index = patches[i][0];
            if (index >= 0 && (size_t)index < count)
                own_program[index].k = patches[i][1] ? (uint32_t)(-pid) : (uint32_t)pid;
        }
        struct sock_fprog program = {(unsigned short)count, own_program};
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, (unsigned long)&program, 0, 0)) {
            fail(&f, APPLY_POLICY, "seccomp filter (own process)");
            goto failed;
        }
    }

    /* hand the metadata listener to the pool, and keep no copy */
    {
        char byte = 'L';
        struct iovec iov = {&byte, 1};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } control;
        memset(&control, 0, sizeof(control));
        struct msghdr message = {0};
        message.msg_iov = &iov;
        message.msg_iovlen = 1;
        message.msg_control = control.buf;
        message.msg_controllen = sizeof(control.buf);
        struct cmsghdr *header = CMSG_FIRSTHDR(&message);
        header->cmsg_level = SOL_SOCKET;
        header->cmsg_type = SCM_RIGHTS;
        header->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(header), &listener, sizeof(int));
        ssize_t sent;
        do
            sent = sendmsg(handover, &message, 0);
        while (sent < 0 && errno == EINTR);
        int saved = errno;
        if (!keep_handover)
            close(handover);
        close(listener);
        listener = -1;
        if (sent < 0) {
            errno = saved;
            fail(&f, HAND_OVER, "sendmsg");
            goto failed;
        }
    }
    result = Py_NewRef(Py_None);
    goto out;

stopped:
    /* A check Python made before the call failed at the start of this stage: the stages before it are done,
       as the Python steps would have done them, and nothing after (the ruleset stays open, as it would). */
    for (int i = 0; i < n_entry_fds; i++)
        close(entry_fds[i]);
    result = Py_NewRef(Py_None);
    goto out;

failed:
    for (int i = 0; i < n_entry_fds; i++)
        close(entry_fds[i]);
    if (listener >= 0)
        close(listener);
    if (ruleset >= 0)
        close(ruleset);
    result = Py_BuildValue("(iis)", f.stage, f.err, f.what);
out:
    return result;
}

/* identities(paths): the (st_dev, st_ino) of each path of a tuple of bytes, by stat(2) as os.stat gives them
 * (symlinks followed), packed as two native uint64 each, (0, 0) for a path that cannot be stat'ed. The template
 * compares them with its runtime rules' in one bytes comparison before every fork (policy.RuntimeRules.refresh):
 * one object, where a stat_result per path (~30) was objects written after every fork (copy-on-write faults). */
static PyObject *identities(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *paths;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &paths))
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(paths);
    PyObject *packed = PyBytes_FromStringAndSize(NULL, count * 2 * (Py_ssize_t)sizeof(uint64_t));
    if (packed == NULL)
        return NULL;
    uint64_t *cells = (uint64_t *)PyBytes_AS_STRING(packed);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *path = PyTuple_GET_ITEM(paths, i);
        if (!PyBytes_Check(path)) {
            Py_DECREF(packed);
            PyErr_SetString(PyExc_TypeError, "identities: every path must be bytes");
            return NULL;
        }
        struct stat info;
        if (stat(PyBytes_AS_STRING(path), &info) == 0) {
            cells[2 * i] = (uint64_t)info.st_dev;
            cells[2 * i + 1] = (uint64_t)info.st_ino;
        } else {
            cells[2 * i] = cells[2 * i + 1] = 0;
        }
    }
    return packed;
}

/* take_job(control, targets, expected, name, staging, max_fd, max_frame): a prepared child's hand-over, as
 * job/child.py's Python path makes it (_await_job, Setup.handed), in one call once it is confined: wait on its
 * control socket for the server's HandOver frame (its descriptors in SCM_RIGHTS with the header, the frame read
 * whole and dropped, as wire.frames.recv_raw reads it), take the job's name (PR_SET_NAME; a name is for
 * operators: its failure is ignored, as there), check that exactly ``expected`` descriptors came, and put the
 * i-th of them at targets[i] and standard input (targets' last, 0) where it is, every other descriptor closed
 * (setup.arrange: each staged above every target first, then put at its number; the runs of unused numbers
 * closed with close_range). A prepared child's Python path wrote ~30 of the template's pages there (a socket
 * object, recvmsg's list and tuples, an array, arrange's lists), each a copy-on-write fault on the job's path.
 *
 * Returns 0 once the job's descriptors are in place; 1 when no job came (the socket closed or failed: the server
 * gave the child up), 2 when the frame broke the protocol (too long, truncated, the wrong number of
 * descriptors), 3 when a descriptor could not be placed. The caller exits on anything but 0 without running
 * anything (SETUP_FAILED_EXIT), as the Python path does. */
#define MAX_HANDED 16
static PyObject *take_job(PyObject *self, PyObject *args) {
    (void)self;
    int control, expected, staging;
    unsigned int max_fd;
    Py_ssize_t max_frame;
    PyObject *targets_tuple, *name;
    if (!PyArg_ParseTuple(args, "iO!iSiIn", &control, &PyTuple_Type, &targets_tuple, &expected, &name, &staging,
                          &max_fd, &max_frame))
        return NULL;
    Py_ssize_t n_targets = PyTuple_GET_SIZE(targets_tuple);
    if (n_targets < 1 || n_targets > MAX_HANDED || expected != n_targets - 1 || staging <= 0 || staging > MAX_ITEMS) {
        PyErr_SetString(PyExc_ValueError, "take_job: bad arguments");
        return NULL;
    }
    int targets[MAX_HANDED];
    for (Py_ssize_t i = 0; i < n_targets; i++) {
        long target = PyLong_AsLong(PyTuple_GET_ITEM(targets_tuple, i));
        if (target < 0 || target >= staging) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "take_job: a target outside [0, staging)");
            return NULL;
        }
        targets[i] = (int)target;
    }
    int code = 0;
    int fds[MAX_HANDED + 1], n = 0;
    unsigned char header[4];
    union {
        char buffer[CMSG_SPACE(sizeof(int) * (MAX_HANDED + 1))];
        struct cmsghdr align;
    } ancillary;
    struct iovec part = {header, sizeof(header)};
    struct msghdr message = {.msg_iov = &part, .msg_iovlen = 1, .msg_control = ancillary.buffer,
                             .msg_controllen = sizeof(ancillary.buffer)};
    ssize_t got;
    do
        got = recvmsg(control, &message, MSG_CMSG_CLOEXEC);
    while (got < 0 && errno == EINTR);
    if (got <= 0)
        return PyLong_FromLong(1);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&message); c != NULL; c = CMSG_NXTHDR(&message, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (n < MAX_HANDED + 1)
                fds[n++] = fd;
            else
                code = 2;
        }
    }
    if (message.msg_flags & MSG_CTRUNC)
        code = 2;  /* descriptors the kernel dropped: never the job's full set */
    /* the rest of the header, then the frame's body, read and dropped (a HandOver carries nothing) */
    while (code == 0 && (size_t)got < sizeof(header)) {
        ssize_t more = recv(control, header + got, sizeof(header) - (size_t)got, 0);
        if (more < 0 && errno == EINTR)
            continue;
        if (more <= 0)
            code = 1;
        else
            got += more;
    }
    if (code == 0) {
        uint32_t size = ((uint32_t)header[0] << 24) | ((uint32_t)header[1] << 16) | ((uint32_t)header[2] << 8)
                        | header[3];
        if ((Py_ssize_t)size > max_frame)
            code = 2;
        char body[256];
        while (code == 0 && size > 0) {
            ssize_t more = recv(control, body, size < sizeof(body) ? size : sizeof(body), 0);
            if (more < 0 && errno == EINTR)
                continue;
            if (more <= 0)
                code = 1;
            else
                size -= (uint32_t)more;
        }
    }
    if (code != 0)
        return PyLong_FromLong(code);  /* the descriptors received go with the child's exit */
    prctl(PR_SET_NAME, (unsigned long)PyBytes_AS_STRING(name), 0, 0, 0);  /* as ProcessName.take: ignored if refused */
    if (n != expected)
        return PyLong_FromLong(2);
    fds[n] = 0;  /* standard input stays at 0 */
    int staged[MAX_HANDED];
    char used[MAX_ITEMS];
    memset(used, 0, sizeof(used));
    for (Py_ssize_t i = 0; i < n_targets; i++)
        if ((staged[i] = fcntl(fds[i], F_DUPFD, staging)) < 0)
            return PyLong_FromLong(3);
    for (Py_ssize_t i = 0; i < n_targets; i++) {
        if (dup2(staged[i], targets[i]) < 0)
            return PyLong_FromLong(3);
        used[targets[i]] = 1;
    }
    close_all_but(used, staging, (int)max_fd - 1);
    return PyLong_FromLong(0);
}

static PyMethodDef methods[] = {
    {"confine", confine, METH_VARARGS,
     "Confine the calling (single-threaded, just forked) child: see pynox.policy.native."},
    {"take_job", take_job, METH_VARARGS,
     "A prepared child's hand-over: its job's descriptors received and placed, its name taken: see job/child.py."},
    {"identities", identities, METH_VARARGS,
     "The (st_dev, st_ino) of each path, packed as native uint64 pairs ((0, 0): none): see RuntimeRules."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_confine", NULL, -1, methods};

#ifndef PYNOX_SOURCE
#define PYNOX_SOURCE ""  /* built without setup.py: its source is not known (see pynox/extensions.py) */
#endif
#ifndef PYNOX_SOURCE_FILE
#define PYNOX_SOURCE_FILE ""  /* its source file's identity not known: the loader hashes the source */
#endif

PyMODINIT_FUNC PyInit__confine(void) {
    PyObject *made = PyModule_Create(&module);
    if (made != NULL && (PyModule_AddStringConstant(made, "SOURCE", PYNOX_SOURCE) < 0
                         || PyModule_AddStringConstant(made, "SOURCE_FILE", PYNOX_SOURCE_FILE) < 0)) {
        Py_DECREF(made);
        return NULL;
    }
    return made;
}
