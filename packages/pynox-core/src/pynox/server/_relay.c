/* A job's relay loop in C: the wait over its pipes and the reads of its output, without the GIL.
 *
 * Relay(stdout, stderr, report, display, max_output, report_limit) owns the reading of a job's (or a session
 * step's) four pipes, with the rules of server/capture.py's Python path, which stays as the fallback
 * (PYNOX_NATIVE=0, or this extension missing) and which tests/pool/test_native_relay.py compares it with:
 *
 *   - stdout and stderr: every byte is counted; at most max_output of each is kept, and a stream past it is
 *     still drained (read and dropped), its truncation flag set;
 *   - the report: kept while it fits in report_limit; a read that would pass it empties it (not a report the
 *     child wrote: the exit status speaks alone), as the Python path does, read by read;
 *   - the display channel: each chunk read is handed to Python (the frames are decoded and bounded there,
 *     display.py) by returning at once; its end is only noted (the caller asks display_ended()).
 *
 * wait(watch, wait_ns) polls the open pipes and the descriptors in watch (a tuple of (fd, events): the
 * template's socket, the pidfd, the host-call channel, ...) for at most wait_ns nanoseconds, reading the pipes
 * as they become readable, and returns the list of the descriptors Python must act on: those of watch with an
 * event, and the display pipe when a chunk of it waits (take_display()). It returns an empty list when the
 * wait is over, and at once (with the list of watch descriptors ready then, maybe empty) when the last of
 * stdout, stderr and the report reaches its end during the call. So a deadline the caller computed is never
 * passed: between two returns, only reads of the pipes happen, and each read is bounded (64 KiB).
 *
 * The GIL is released for the whole wait and its reads: nothing in the loop touches a Python object. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define READ_CHUNK (1 << 16) /* capture.py's _READ_CHUNK */
#define MAX_WATCH 64
enum { OUT, ERR, REPORT, DISPLAY, PIPES };

typedef struct {
    PyObject_HEAD
    int fd[PIPES];            /* -1 once at its end */
    char *kept[REPORT + 1];   /* what is kept of stdout, stderr, the report */
    Py_ssize_t len[REPORT + 1], room[REPORT + 1], limit[REPORT + 1];
    long long written[2];     /* stdout's and stderr's bytes, kept or not */
    int truncated[2];
    int open;                 /* stdout, stderr and the report not at their end */
    int display_ended;
    char *display;            /* a chunk of the display channel not taken yet */
    Py_ssize_t display_len;
    char *scratch;
} Relay;

static void relay_dealloc(Relay *self) {
    for (int i = 0; i <= REPORT; i++)
        free(self->kept[i]);
    free(self->display);
    free(self->scratch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int relay_init(Relay *self, PyObject *args, PyObject *kwds) {
    int out, err, report, display;
    Py_ssize_t max_output, report_limit;
    if (!PyArg_ParseTuple(args, "iiiinn", &out, &err, &report, &display, &max_output, &report_limit))
        return -1;
    if (max_output < 0 || report_limit < 0) {
        PyErr_SetString(PyExc_ValueError, "the limits must not be negative");
        return -1;
    }
    if (self->scratch != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Relay is made once");
        return -1;
    }
    self->fd[OUT] = out, self->fd[ERR] = err, self->fd[REPORT] = report, self->fd[DISPLAY] = display;
    self->limit[OUT] = self->limit[ERR] = max_output, self->limit[REPORT] = report_limit;
    self->open = 3;
    self->scratch = malloc(READ_CHUNK);
    self->display = malloc(READ_CHUNK);
    if (self->scratch == NULL || self->display == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Append n bytes to what is kept of pipe i (n fits its limit); -1 if memory runs out. */
static int keep(Relay *self, int i, const char *data, Py_ssize_t n) {
    if (n == 0)
        return 0;
    Py_ssize_t need = self->len[i] + n;
    if (need > self->room[i]) {
        Py_ssize_t room = self->room[i] ? self->room[i] : 4096;
        while (room < need)
            room *= 2;
        if (room > self->limit[i] && self->limit[i] >= need)
            room = self->limit[i];
        char *grown = realloc(self->kept[i], (size_t)room);
        if (grown == NULL)
            return -1;
        self->kept[i] = grown, self->room[i] = room;
    }
    memcpy(self->kept[i] + self->len[i], data, (size_t)n);
    self->len[i] = need;
    return 0;
}

/* What one read of pipe i brought: n bytes in scratch. capture.py's Capture.read and _keep, the same rules. */
static int took(Relay *self, int i, Py_ssize_t n) {
    if (i == REPORT) {
        if (self->len[REPORT] + n > self->limit[REPORT]) {
            self->len[REPORT] = 0;
            return 0;
        }
        return keep(self, REPORT, self->scratch, n);
    }
    self->written[i] += n;
    Py_ssize_t room = self->limit[i] - self->len[i];
    if (n > room) {
        n = room > 0 ? room : 0;
        self->truncated[i] = 1;
    }
    return keep(self, i, self->scratch, n);
}

static int64_t now_ns(void) {
    struct timespec at;
    clock_gettime(CLOCK_MONOTONIC, &at);
    return (int64_t)at.tv_sec * 1000000000 + at.tv_nsec;
}

static PyObject *relay_wait(Relay *self, PyObject *args) {
    PyObject *watch;
    long long wait_ns;
    if (!PyArg_ParseTuple(args, "O!L", &PyTuple_Type, &watch, &wait_ns))
        return NULL;
    Py_ssize_t watched = PyTuple_GET_SIZE(watch);
    if (watched > MAX_WATCH) {
        PyErr_SetString(PyExc_ValueError, "too many descriptors to watch");
        return NULL;
    }
    struct pollfd polled[PIPES + MAX_WATCH];
    int pipe_of[PIPES];
    for (Py_ssize_t w = 0; w < watched; w++) {
        int fd, events;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(watch, w), "ii", &fd, &events))
            return NULL;
        polled[PIPES + w] = (struct pollfd){.fd = fd, .events = (short)events};
    }
    int64_t deadline = now_ns() + (wait_ns > 0 ? wait_ns : 0);
    int open_at_entry = self->open, failed = 0, display_waits = 0, ready = 0;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        /* The pipes still open first, then the watched descriptors: one array, the pipes' part compacted. */
        int n = 0;
        for (int i = 0; i < PIPES; i++)
            if (self->fd[i] >= 0 && !(i == DISPLAY && self->display_len)) { /* a chunk waits: taken first */
                pipe_of[n] = i;
                polled[n++] = (struct pollfd){.fd = self->fd[i], .events = POLLIN};
            }
        if (n < PIPES)
            memmove(polled + n, polled + PIPES, sizeof(struct pollfd) * (size_t)watched);
        int64_t left = deadline - now_ns();
        int timeout = left <= 0 ? 0 : (int)((left + 999999) / 1000000); /* rounded up to a millisecond */
        int got = poll(polled, (nfds_t)(n + watched), timeout);
        if (n < PIPES) /* back where the next turn and the caller's list expect them */
            memmove(polled + PIPES, polled + n, sizeof(struct pollfd) * (size_t)watched);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            failed = errno;
            break;
        }
        for (int k = 0; k < n && got > 0; k++) {
            if (!polled[k].revents)
                continue;
            int i = pipe_of[k];
            ssize_t r = read(self->fd[i], i == DISPLAY ? self->display : self->scratch, READ_CHUNK);
            if (r < 0) {
                if (errno == EINTR || errno == EAGAIN)
                    continue;
                failed = errno;
                break;
            }
            if (r == 0) {
                self->fd[i] = -1;
                if (i == DISPLAY)
                    self->display_ended = 1;
                else
                    self->open--;
            } else if (i == DISPLAY) {
                self->display_len = r;
                display_waits = 1;
            } else if (took(self, i, r) < 0) {
                failed = ENOMEM;
                break;
            }
        }
        if (failed)
            break;
        for (Py_ssize_t w = 0; w < watched; w++)
            ready += polled[PIPES + w].revents != 0;
        if (ready || display_waits || (open_at_entry && !self->open) || now_ns() >= deadline)
            break;
    }
    Py_END_ALLOW_THREADS
    if (failed == ENOMEM)
        return PyErr_NoMemory();
    if (failed) {
        errno = failed;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *fds = PyList_New(0);
    if (fds == NULL)
        return NULL;
    for (Py_ssize_t w = 0; w < watched && ready; w++) {
        if (!polled[PIPES + w].revents)
            continue;
        PyObject *fd = PyLong_FromLong(polled[PIPES + w].fd);
        if (fd == NULL || PyList_Append(fds, fd) < 0) {
            Py_XDECREF(fd);
            Py_DECREF(fds);
            return NULL;
        }
        Py_DECREF(fd);
    }
    if (display_waits) {
        PyObject *fd = PyLong_FromLong(self->fd[DISPLAY]);
        if (fd == NULL || PyList_Append(fds, fd) < 0) {
            Py_XDECREF(fd);
            Py_DECREF(fds);
            return NULL;
        }
        Py_DECREF(fd);
    }
    return fds;
}

static PyObject *relay_take_display(Relay *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *chunk = PyBytes_FromStringAndSize(self->display, self->display_len);
    if (chunk != NULL)
        self->display_len = 0;
    return chunk;
}

static PyObject *kept(Relay *self, int i) {
    return PyBytes_FromStringAndSize(self->kept[i] ? self->kept[i] : "", self->len[i]);
}

static PyObject *relay_stdout(Relay *self, PyObject *Py_UNUSED(ignored)) { return kept(self, OUT); }
static PyObject *relay_stderr(Relay *self, PyObject *Py_UNUSED(ignored)) { return kept(self, ERR); }
static PyObject *relay_report(Relay *self, PyObject *Py_UNUSED(ignored)) { return kept(self, REPORT); }

static PyObject *relay_counts(Relay *self, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("(LLOOiO)", self->written[OUT], self->written[ERR], self->truncated[OUT] ? Py_True : Py_False,
                         self->truncated[ERR] ? Py_True : Py_False, self->open,
                         self->display_ended ? Py_True : Py_False);
}

static PyObject *relay_open(Relay *self, void *Py_UNUSED(closure)) { return PyLong_FromLong(self->open); }

static PyMethodDef relay_methods[] = {
    {"wait", (PyCFunction)relay_wait, METH_VARARGS,
     "wait(watch, wait_ns): read the pipes; the descriptors Python must act on (see the module's comment)"},
    {"take_display", (PyCFunction)relay_take_display, METH_NOARGS, "the display chunk read last (b'' if none)"},
    {"stdout", (PyCFunction)relay_stdout, METH_NOARGS, "what is kept of stdout"},
    {"stderr", (PyCFunction)relay_stderr, METH_NOARGS, "what is kept of stderr"},
    {"report", (PyCFunction)relay_report, METH_NOARGS, "what is kept of the report"},
    {"counts", (PyCFunction)relay_counts, METH_NOARGS,
     "(stdout bytes, stderr bytes, stdout truncated, stderr truncated, open, display ended)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef relay_getset[] = {
    {"open", (getter)relay_open, NULL, "stdout, stderr and the report not at their end yet", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RelayType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pynox.server._relay.Relay",
    .tp_basicsize = sizeof(Relay),
    .tp_dealloc = (destructor)relay_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A job's pipes read with capture.py's rules (see the module's comment).",
    .tp_methods = relay_methods,
    .tp_getset = relay_getset,
    .tp_init = (initproc)relay_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_relay", "A job's relay loop in C (see server/capture.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__relay(void) {
    if (PyType_Ready(&RelayType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RelayType);
    if (PyModule_AddObject(m, "Relay", (PyObject *)&RelayType) < 0) {
        Py_DECREF(&RelayType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
