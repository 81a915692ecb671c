/* The template's steady state in one native call: reap a child, report it, fork its replacement, and again.
 *
 * Back to back jobs of one confinement reach the template as nothing but ends of children: the server hands each
 * job to a child prepared ahead, and the template reaps that child (an Ended frame) and prepares the next (a
 * Prepared frame with its pidfd and control socket). In Python each such cycle wrote objects all over the
 * template's heap (reference counts of code, functions, dicts, the frames' encoders), every page of which the
 * children forked before share copy-on-write: about 160 page faults a job, each a page copied. This loop writes
 * its own stack and a few static words, and nothing of Python's but the import lock's state that PyOS_BeforeFork
 * takes, as os.fork does (template/fork_server.py, _Children.serve_natively, says when it is entered).
 *
 * serve(sock, children, serial, limit, job, rules, setups, watched, room): waits on the server's socket and the
 * pidfds of ``children`` (a tuple of (serial, pid, pidfd), every one a child prepared from the latest lineage,
 * not discarded: the caller checked). A child that ends is reaped and reported at once (Ended, the bytes msgspec
 * writes for it, with as many prepares as children are missing), as _Children.reap does; then, as reap and
 * prepare check them, after a SIGKILL the memory cgroup must have room for those children (``room``: (key, mount
 * point, version, bytes a child needs), the template's _MemoryRoom; None: no memory hierarchy), and before each
 * fork the runtime rules' paths must still name the files the rules hold (``watched``: (paths, held identities)
 * pairs, RuntimeRules.refresh's comparison). Each is forked with the setup laid out for its control socket's
 * descriptor (``setups``: (descriptor, Setup) pairs). Anything else is left for Python: a frame from the server,
 * EINTR, untouched; and the children announced and not forked yet, when a cgroup is short of room (or its files
 * are of a shape not expected), a rule is to be reopened, a setup is not laid out, or a fork failed.
 *
 * Returns, in a child it forked: that child's Setup (the caller runs job.child.run_prepared with it at once).
 * In the template: bytes holding native int64s, RESULT_HEAD of them first (how many children there are now, the
 * next serial, how many children an Ended frame announced that are not forked yet and why (PYTHON_PREPARES:
 * Python prepares them; FORK_FAILED: their fork failed, so the server is told they will not come; ROOM_UNKNOWN:
 * Python reads the room first), and the errno of a send that failed (0: none)), then (serial, pid, pidfd) of each
 * child now. Those bytes are allocated before the loop, and nothing after it can fail: once a child is reaped (its
 * pidfd closed) or forked, the caller always learns it. (A result built after the loop could fail with
 * MemoryError there, and the caller's books would keep closed pidfd numbers, which another descriptor may take,
 * and miss the children forked.) An exception is raised only before anything is done. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define MAX_CHILDREN 64
#define MAX_SETUPS 8
#define MAX_WATCHED 2
#define FRAME_SIZE 160

/* Why children announced are left for Python (see above). */
enum { PYTHON_PREPARES, FORK_FAILED, ROOM_UNKNOWN };
/* The result's int64s before its children's: count, serial, pending, why, error. */
#define RESULT_HEAD 5

struct child {
    long long serial;
    int pid, pidfd;
};

struct loop {
    int sock;
    struct child children[MAX_CHILDREN];
    int count;
    long long serial, limit, job, rules;
    int setup_fds[MAX_SETUPS];
    PyObject *setups[MAX_SETUPS]; /* borrowed from the arguments */
    int setup_count;
    PyObject *watched[MAX_WATCHED][2]; /* (paths, held) of each RuntimeRules, borrowed */
    int watched_count;
    PyObject *room; /* (key, point, version, per child), borrowed; NULL: no memory hierarchy */
    long long pending;
    int why, error;
};

/* Writes all of a frame: its 4-byte big-endian length, then the payload, the descriptors with the header (as
 * wire/frames.py send_frame does). 0, or the errno of the send. */
static int send_frame(int sock, const char *payload, size_t size, const int *fds, int nfds) {
    unsigned char header[4] = {(unsigned char)(size >> 24), (unsigned char)(size >> 16), (unsigned char)(size >> 8),
                               (unsigned char)size};
    struct iovec parts[2] = {{header, 4}, {(void *)payload, size}};
    union {
        char buffer[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct msghdr message = {0};
    message.msg_iov = parts;
    message.msg_iovlen = 2;
    if (nfds > 0) {
        memset(&control, 0, sizeof(control));
        message.msg_control = control.buffer;
        message.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        struct cmsghdr *rights = CMSG_FIRSTHDR(&message);
        rights->cmsg_level = SOL_SOCKET;
        rights->cmsg_type = SCM_RIGHTS;
        rights->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(rights), fds, (size_t)nfds * sizeof(int));
    }
    ssize_t sent;
    do
        sent = sendmsg(sock, &message, 0);
    while (sent < 0 && errno == EINTR);
    if (sent < 0)
        return errno;
    size_t total = 4 + size;
    while ((size_t)sent < total) { /* the rest, as sendall: a blocking socket took only part */
        const char *from = (size_t)sent < 4 ? (const char *)header + sent : payload + ((size_t)sent - 4);
        size_t left = (size_t)sent < 4 ? 4 - (size_t)sent : total - (size_t)sent;
        ssize_t more = send(sock, from, left, 0);
        if (more < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        sent += more;
    }
    return 0;
}

/* Whether every path of each watched RuntimeRules still names the file its rule holds: the comparison
 * RuntimeRules.refresh makes first ((st_dev, st_ino) packed as two native uint64, (0, 0) for none). */
static int rules_hold(struct loop *loop) {
    for (int w = 0; w < loop->watched_count; w++) {
        PyObject *paths = loop->watched[w][0], *held = loop->watched[w][1];
        Py_ssize_t count = PyTuple_GET_SIZE(paths);
        if (PyBytes_GET_SIZE(held) != count * 2 * (Py_ssize_t)sizeof(uint64_t))
            return 0;
        const char *cells = PyBytes_AS_STRING(held);
        for (Py_ssize_t i = 0; i < count; i++) {
            uint64_t now[2] = {0, 0};
            struct stat info;
            if (stat(PyBytes_AS_STRING(PyTuple_GET_ITEM(paths, i)), &info) == 0) {
                now[0] = (uint64_t)info.st_dev;
                now[1] = (uint64_t)info.st_ino;
            }
            if (memcmp(now, cells + i * 2 * sizeof(uint64_t), sizeof(now)) != 0)
                return 0;
        }
    }
    return 1;
}

/* The first ``size`` bytes of a file, NUL-terminated; -1 if it cannot be read. */
static ssize_t read_head(const char *path, char *buffer, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t got = pread(fd, buffer, size - 1, 0);
    close(fd);
    if (got < 0)
        return -1;
    buffer[got] = '\0';
    return got;
}

/* A number as int() reads the file (ASCII digits between white space); -1 for anything else. */
static long long number(const char *text) {
    while (*text == ' ' || *text == '\n' || *text == '\t')
        text++;
    long long value = 0;
    int digits = 0;
    for (; *text >= '0' && *text <= '9'; text++, digits++) {
        if (value > (LLONG_MAX - 9) / 10)
            return -1;
        value = value * 10 + (*text - '0');
    }
    while (*text == ' ' || *text == '\n' || *text == '\t')
        text++;
    return digits && !*text ? value : -1;
}

/* Whether the template's memory cgroup has room for ``children`` more, read as _MemoryRoom._room reads it; 0
 * where Python must judge (a cgroup short of room, whose page cache then counts, or a file of a shape not known). */
static int room_for(struct loop *loop, long long children) {
    if (loop->room == NULL)
        return 1; /* no memory hierarchy: the room is not known, and every child is prepared */
    PyObject *key = PyTuple_GET_ITEM(loop->room, 0), *point = PyTuple_GET_ITEM(loop->room, 1);
    long version = PyLong_AsLong(PyTuple_GET_ITEM(loop->room, 2));
    long long per_child = PyLong_AsLongLong(PyTuple_GET_ITEM(loop->room, 3));
    if (PyErr_Occurred()) { /* a number out of range: no exception may be left set, Python judges */
        PyErr_Clear();
        return 0;
    }
    char own[1 << 13];
    if (read_head("/proc/self/cgroup", own, sizeof(own)) < 0)
        return 0;
    /* Its line for the hierarchy (hierarchy-ID:controllers:path; the last one, as a dict of them keeps). */
    const char *path = NULL;
    size_t path_size = 0, key_size = (size_t)PyBytes_GET_SIZE(key);
    for (char *line = own; *line;) {
        char *end = strchr(line, '\n');
        size_t size = end ? (size_t)(end - line) : strlen(line);
        char *first = memchr(line, ':', size);
        char *second = first ? memchr(first + 1, ':', size - (size_t)(first + 1 - line)) : NULL;
        if (second == NULL)
            return 0;
        if ((size_t)(second - first - 1) == key_size && memcmp(first + 1, PyBytes_AS_STRING(key), key_size) == 0) {
            path = second + 1;
            path_size = size - (size_t)(second + 1 - line);
        }
        line = end ? end + 1 : line + size;
    }
    if (path == NULL)
        return 0;
    while (path_size && *path == '/')
        path++, path_size--;
    char file[PATH_MAX], text[64];
    int written = snprintf(file, sizeof(file), "%s/%.*s/%s", PyBytes_AS_STRING(point), (int)path_size, path,
                           version == 1 ? "memory.limit_in_bytes" : "memory.max");
    if (written < 0 || (size_t)written >= sizeof(file) || read_head(file, text, sizeof(text)) < 0)
        return 0;
    long long limit = number(text);
    if (limit < 0) {
        const char *rest = text;
        while (*rest == ' ' || *rest == '\n' || *rest == '\t')
            rest++;
        /* v2's "max" (any word that is not a number, as isdigit judges the stripped text): no limit */
        return *rest && (*rest < '0' || *rest > '9');
    }
    written = snprintf(file, sizeof(file), "%s/%.*s/%s", PyBytes_AS_STRING(point), (int)path_size, path,
                       version == 1 ? "memory.usage_in_bytes" : "memory.current");
    if (written < 0 || (size_t)written >= sizeof(file) || read_head(file, text, sizeof(text)) < 0)
        return 0;
    long long held = number(text);
    return held >= 0 && per_child > 0 && children <= LLONG_MAX / per_child && limit - held >= children * per_child;
}

/* Forks one child prepared from the lineage. 1: forked and announced (in the template); 2: in the child, its
 * setup in ``*setup``; 0: left for Python (loop->pending stays; loop->why or loop->error say why). */
static int prepare(struct loop *loop, PyObject **setup) {
    int pair[2];
    if (loop->count >= MAX_CHILDREN || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
        return 0; /* Python's socketpair raises as it would have */
    int control = pair[0], child_end = pair[1];
    *setup = NULL;
    for (int i = 0; i < loop->setup_count; i++)
        if (loop->setup_fds[i] == child_end)
            *setup = loop->setups[i];
    if (*setup == NULL || PySys_Audit("os.fork", NULL) < 0) {
        PyErr_Clear(); /* Python's os.fork runs the audit hook again, and raises as it would have */
        close(control);
        close(child_end);
        return 0;
    }
    PyOS_BeforeFork();
    pid_t pid = fork();
    if (pid == 0) {
        PyOS_AfterFork_Child();
        return 2;
    }
    PyOS_AfterFork_Parent();
    close(child_end);
    if (pid < 0) {
        close(control);
        loop->why = FORK_FAILED;
        return 0;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) { /* no handle on it (EMFILE, ENOMEM): it is not kept, and counts as not forked */
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        close(control);
        loop->why = FORK_FAILED;
        return 0;
    }
    struct child *child = &loop->children[loop->count++];
    child->serial = loop->serial++;
    child->pid = pid;
    child->pidfd = pidfd;
    loop->pending--;
    char frame[FRAME_SIZE];
    int size = snprintf(frame, sizeof(frame), "{\"type\":\"Prepared\",\"serial\":%lld,\"pid\":%d,\"job\":%lld,"
                                              "\"rules\":%lld}", child->serial, pid, loop->job, loop->rules);
    int fds[2] = {pidfd, control};
    loop->error = send_frame(loop->sock, frame, (size_t)size, fds, 2);
    close(control);
    return loop->error ? 0 : 1;
}

/* Child ``index`` ended: reap and report it, then prepare those missing. 1: done, go on; 2: in a forked child;
 * 0: return to Python (nothing done if it could not be reaped; see loop->pending otherwise). */
static int reap(struct loop *loop, int index, PyObject **setup) {
    struct child ended = loop->children[index];
    int status;
    struct rusage usage;
    pid_t reaped;
    do
        reaped = wait4(ended.pid, &status, 0, &usage);
    while (reaped < 0 && errno == EINTR);
    if (reaped != ended.pid)
        return 0; /* not to be (its pidfd said it ended): Python's wait4 raises */
    close(ended.pidfd);
    loop->children[index] = loop->children[--loop->count];
    long long missing = loop->limit - loop->count;
    if (missing < 0)
        missing = 0;
    /* As os.wait4's struct_rusage gives the times (seconds as doubles) and Python's int() truncates them. */
    double user = (double)usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 0.000001;
    double system = (double)usage.ru_stime.tv_sec + usage.ru_stime.tv_usec * 0.000001;
    char frame[FRAME_SIZE];
    int size = snprintf(frame, sizeof(frame), "{\"type\":\"Ended\",\"serial\":%lld,\"status\":%d,\"cpu_us\":%lld,"
                                              "\"max_rss_kb\":%ld,\"prepares\":%lld}",
                        ended.serial, status, (long long)((user + system) * 1e6), usage.ru_maxrss, missing);
    loop->error = send_frame(loop->sock, frame, (size_t)size, NULL, 0);
    if (loop->error)
        return 0;
    loop->pending = missing;
    /* A child killed may leave its cgroup full (see reap): only as many are prepared as it has room for. */
    if (missing && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && !room_for(loop, missing)) {
        loop->why = ROOM_UNKNOWN;
        return 0;
    }
    while (loop->pending) {
        if (!rules_hold(loop))
            return 0; /* a rule to reopen before the next: Python refreshes, lays out, and forks the rest */
        int done = prepare(loop, setup);
        if (done != 1)
            return done;
    }
    return 1;
}

static PyObject *serve(PyObject *self, PyObject *args) {
    (void)self;
    static struct loop loop; /* one page of the template's own, written every cycle */
    PyObject *children, *setups, *watched, *room;
    memset(&loop, 0, sizeof(loop));
    if (!PyArg_ParseTuple(args, "iO!LLLLO!O!O", &loop.sock, &PyTuple_Type, &children, &loop.serial, &loop.limit,
                          &loop.job, &loop.rules, &PyTuple_Type, &setups, &PyTuple_Type, &watched, &room))
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(children);
    if (count > MAX_CHILDREN || PyTuple_GET_SIZE(setups) > MAX_SETUPS || PyTuple_GET_SIZE(watched) > MAX_WATCHED) {
        PyErr_SetString(PyExc_ValueError, "serve: more children, setups or rules than the loop holds");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        struct child *child = &loop.children[i];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(children, i), "Lii", &child->serial, &child->pid, &child->pidfd))
            return NULL;
    }
    loop.count = (int)count;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(setups); i++) {
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(setups, i), "iO", &loop.setup_fds[i], &loop.setups[i]))
            return NULL;
    }
    loop.setup_count = (int)PyTuple_GET_SIZE(setups);
    for (Py_ssize_t w = 0; w < PyTuple_GET_SIZE(watched); w++) {
        PyObject *paths, *held;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(watched, w), "O!O!", &PyTuple_Type, &paths, &PyBytes_Type, &held))
            return NULL;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(paths); i++)
            if (!PyBytes_Check(PyTuple_GET_ITEM(paths, i))) {
                PyErr_SetString(PyExc_TypeError, "serve: every watched path must be bytes");
                return NULL;
            }
        loop.watched[w][0] = paths;
        loop.watched[w][1] = held;
    }
    loop.watched_count = (int)PyTuple_GET_SIZE(watched);
    if (room != Py_None) {
        if (!PyTuple_Check(room) || PyTuple_GET_SIZE(room) != 4 || !PyBytes_Check(PyTuple_GET_ITEM(room, 0))
            || !PyBytes_Check(PyTuple_GET_ITEM(room, 1)) || !PyLong_Check(PyTuple_GET_ITEM(room, 2))
            || !PyLong_Check(PyTuple_GET_ITEM(room, 3))) {
            PyErr_SetString(PyExc_TypeError, "serve: room must be (key, point, version, bytes per child)");
            return NULL;
        }
        loop.room = room;
    }

    /* The result, made now: after the loop, nothing may fail (see above). */
    PyObject *result = PyBytes_FromStringAndSize(NULL, (RESULT_HEAD + 3 * MAX_CHILDREN) * sizeof(long long));
    if (result == NULL)
        return NULL;
    PyObject *setup = NULL;
    for (;;) {
        struct pollfd ready[MAX_CHILDREN + 1];
        ready[0].fd = loop.sock;
        ready[0].events = POLLIN;
        for (int i = 0; i < loop.count; i++) {
            ready[i + 1].fd = loop.children[i].pidfd;
            ready[i + 1].events = POLLIN;
        }
        if (poll(ready, (nfds_t)loop.count + 1, -1) < 0 || ready[0].revents)
            break; /* a frame, the server's end, or a signal (EINTR): Python's */
        int ended = -1;
        for (int i = 0; i < loop.count && ended < 0; i++)
            if (ready[i + 1].revents)
                ended = i;
        if (ended < 0)
            continue;
        int done = reap(&loop, ended, &setup);
        if (done == 2) {
            Py_DECREF(result);
            Py_INCREF(setup); /* in the child: its own copy of the page */
            return setup;
        }
        if (done == 0)
            break;
    }

    long long *cells = (long long *)PyBytes_AS_STRING(result);
    long long head[RESULT_HEAD] = {loop.count, loop.serial, loop.pending, loop.why, loop.error};
    memcpy(cells, head, sizeof(head));
    for (int i = 0; i < loop.count; i++) {
        long long entry[3] = {loop.children[i].serial, loop.children[i].pid, loop.children[i].pidfd};
        memcpy(cells + RESULT_HEAD + 3 * i, entry, sizeof(entry));
    }
    return result;
}

static PyMethodDef methods[] = {
    {"serve", serve, METH_VARARGS,
     "Reap and prepare children while nothing else happens: see pynox.template.fork_server._Children."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fork_loop", NULL, -1, methods};

#ifndef PYNOX_SOURCE
#define PYNOX_SOURCE ""  /* built without setup.py: its source is not known (see pynox/extensions.py) */
#endif
#ifndef PYNOX_SOURCE_FILE
#define PYNOX_SOURCE_FILE ""  /* its source file's identity not known: the loader hashes the source */
#endif

PyMODINIT_FUNC PyInit__fork_loop(void) {
    PyObject *created = PyModule_Create(&module);
    if (created != NULL && (PyModule_AddStringConstant(created, "SOURCE", PYNOX_SOURCE) < 0
                            || PyModule_AddStringConstant(created, "SOURCE_FILE", PYNOX_SOURCE_FILE) < 0
                            || PyModule_AddIntConstant(created, "MAX_CHILDREN", MAX_CHILDREN) < 0
                            || PyModule_AddIntConstant(created, "FORK_FAILED", FORK_FAILED) < 0
                            || PyModule_AddIntConstant(created, "ROOM_UNKNOWN", ROOM_UNKNOWN) < 0
                            || PyModule_AddIntConstant(created, "RESULT_HEAD", RESULT_HEAD) < 0)) {
        Py_DECREF(created);
        return NULL;
    }
    return created;
}
