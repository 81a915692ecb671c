"""Run a command the way ``docker run`` starts a container's process by default, in what Pynox can feel of it.

    python -m tests.setups.container [--profile docker|docker-pre-20.10.18] -- COMMAND...

Run as root. The launcher changes itself, then execs COMMAND, which inherits all of it:

* **Capabilities**: Docker's default set (``CAPABILITIES``) in the bounding, permitted, effective and
  inheritable sets, every other capability dropped. Root inside keeps uid 0 but has no CAP_SYS_ADMIN,
  CAP_SYS_PTRACE, CAP_SYS_NICE or CAP_SYS_RESOURCE, as in a container.
* **Nice 0**: a container's first process descends from the container daemon, not from whoever ran
  ``docker run``, so it starts at the daemon's nice value, normally 0. The launcher sets 0 before it drops
  CAP_SYS_NICE: started niced (CI runners often are), the command could otherwise never return below that
  value, as a container's process can.
* **No no_new_privs**: Docker sets it only when asked (``--security-opt no-new-privileges``). The kernel
  accepts a filter without it only from a holder of CAP_SYS_ADMIN, so the filter goes in first and the
  capabilities are dropped after.
* **A seccomp filter** modelled on Docker's default profile (moby's ``profiles/seccomp/default.json``), as
  that profile applies to a container with the default capabilities.

The filter is an allow-list, as the profile is: every call not listed below is refused with EPERM, the
profile's default action. A deny-list would be shorter but would let through every call Docker refuses and
we forgot to name, a test setup greener than the real one; with an allow-list a call Docker allows that we
forgot fails here first, a false alarm we see and fix. New system calls are refused until listed, as
Docker refuses them until its profile is updated.

Within the list, the profile's conditions for these capabilities:

* ``clone`` only without namespace flags (``CLONE_NAMESPACES``); ``clone3`` answers ENOSYS (its flags are in
  memory seccomp cannot read; libc then falls back to ``clone``).
* ``socket`` for every address family up to 45 but a few (``REFUSED_FAMILIES``, AF_VSOCK among them), and
  none from 46 on.
* ``personality`` only with the values a program uses to query or to run as Linux (``PERSONALITIES``).
* ``chroot`` is allowed because CAP_SYS_CHROOT is in the default set; ``ptrace`` and ``process_vm_readv``/
  ``writev`` are allowed to every container (the kernel checks them against the capabilities), while
  ``kcmp``, ``pidfd_getfd`` and ``process_madvise`` need CAP_SYS_PTRACE and are refused.
* Refused for want of a capability the container lacks, so absent from the list: mount and the new mount
  API, ``unshare``, ``setns``, ``bpf``, ``perf_event_open``, ``fanotify_init``, ``quotactl``, ``syslog``,
  ``sethostname``, ``setdomainname``, the memory-policy calls (``mbind``, ``get_mempolicy``,
  ``set_mempolicy``), ``open_by_handle_at``, ``acct``, ``reboot``, the module and kexec calls, ``iopl``,
  ``ioperm``, setting the clock, ``vhangup``, the LSM attribute calls. Never allowed to anyone:
  ``io_uring_*``, ``userfaultfd``, the key calls (``keyctl``, ``add_key``, ``request_key``), ``move_pages``,
  ``migrate_pages``, ``lookup_dcookie``, ``pivot_root``, ``swapon``, ``file_getattr``/``file_setattr``.

Profiles: ``docker`` is the current default profile; ``docker-pre-20.10.18`` is the same without the three
Landlock calls, which older Docker profiles (and runtimes of that age) do not list, so they answer EPERM
and Pynox must refuse to start, saying why.

Not modelled: the namespaces (PID, mount, network, UTS, IPC, cgroup), AppArmor or SELinux, masked and
read-only ``/proc`` paths, cgroup limits. Only the machine's native system call ABI is modelled: the
profile also admits the 32-bit x86 ABIs on x86_64; here a call through one is refused (EPERM), and the
32-bit and time64 forms of the calls, and other architectures' own calls, are not listed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
from collections.abc import Iterable, Sequence

import pyseccomp

from tests.harness import procfs

__all__ = ["CAPABILITIES", "CAPABILITY_MASK", "PROFILES", "enter", "main"]

PROFILES = ("docker", "docker-pre-20.10.18")

# Docker's default capability set, by number (linux/capability.h).
CAPABILITIES = {
    "CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_FSETID": 4, "CAP_KILL": 5, "CAP_SETGID": 6,
    "CAP_SETUID": 7, "CAP_SETPCAP": 8, "CAP_NET_BIND_SERVICE": 10, "CAP_NET_RAW": 13, "CAP_SYS_CHROOT": 18,
    "CAP_MKNOD": 27, "CAP_AUDIT_WRITE": 29, "CAP_SETFCAP": 31,
}
CAPABILITY_MASK = sum(1 << number for number in CAPABILITIES.values())  # 0xa80425fb, as a container shows

# Allowed to every container, grouped by what they are for.
_FILES = (
    "access", "faccessat", "faccessat2", "open", "openat", "openat2", "creat", "close", "close_range",
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "preadv2", "pwritev", "pwritev2",
    "lseek", "dup", "dup2", "dup3", "fcntl", "ioctl", "flock", "fsync", "fdatasync", "sync", "syncfs",
    "sync_file_range", "fallocate", "fadvise64", "readahead", "truncate", "ftruncate", "copy_file_range",
    "sendfile", "splice", "tee", "vmsplice", "stat", "lstat", "fstat", "newfstatat", "statx", "statfs",
    "fstatfs", "getdents", "getdents64", "getcwd", "chdir", "fchdir", "mkdir", "mkdirat", "rmdir", "mknod",
    "mknodat", "link", "linkat", "symlink", "symlinkat", "readlink", "readlinkat", "rename", "renameat",
    "renameat2", "unlink", "unlinkat", "umask", "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown",
    "lchown", "fchownat", "utime", "utimes", "utimensat", "futimesat", "name_to_handle_at", "cachestat",
    "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_mark",
    "statmount", "listmount",
)
_XATTRS = (
    "getxattr", "lgetxattr", "fgetxattr", "getxattrat", "listxattr", "llistxattr", "flistxattr", "listxattrat",
    "setxattr", "lsetxattr", "fsetxattr", "setxattrat", "removexattr", "lremovexattr", "fremovexattr",
    "removexattrat",
)
_MEMORY = (
    "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "mincore", "msync", "mlock", "mlock2", "mlockall",
    "munlock", "munlockall", "membarrier", "memfd_create", "memfd_secret", "pkey_alloc", "pkey_free",
    "pkey_mprotect", "remap_file_pages", "map_shadow_stack", "mseal",
)
_PROCESSES = (
    "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "set_tid_address",
    "set_robust_list", "get_robust_list", "futex", "futex_waitv", "futex_wake", "futex_wait", "futex_requeue",
    "rseq", "set_thread_area", "get_thread_area", "restart_syscall", "gettid", "getpid", "getppid", "getpgid",
    "setpgid", "getpgrp", "getsid", "setsid", "prctl", "seccomp", "capget", "capset", "getrlimit", "setrlimit",
    "prlimit64", "getrusage", "getpriority", "setpriority", "sched_yield", "sched_getaffinity",
    "sched_setaffinity", "sched_getattr", "sched_setattr", "sched_getparam", "sched_setparam",
    "sched_getscheduler", "sched_setscheduler", "sched_get_priority_max", "sched_get_priority_min",
    "sched_rr_get_interval", "ioprio_get", "ioprio_set", "getcpu", "sysinfo", "uname", "pidfd_open",
    "pidfd_send_signal", "process_mrelease", "getrandom", "ptrace", "process_vm_readv", "process_vm_writev",
)
_IDENTITY = (
    "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups", "setuid", "setgid",
    "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid", "setgroups",
)
_SIGNALS = (
    "kill", "tkill", "tgkill", "rt_sigaction", "rt_sigprocmask", "rt_sigpending", "rt_sigsuspend",
    "rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "rt_sigreturn", "sigaltstack", "signalfd",
    "signalfd4", "pause",
)
_TIME = (
    "alarm", "getitimer", "setitimer", "nanosleep", "clock_gettime", "clock_getres", "clock_nanosleep",
    "gettimeofday", "time", "times", "adjtimex", "clock_adjtime", "timer_create", "timer_delete",
    "timer_gettime", "timer_settime", "timer_getoverrun", "timerfd_create", "timerfd_gettime", "timerfd_settime",
)
_WAITING = (
    "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait",
    "epoll_pwait", "epoll_pwait2", "epoll_ctl_old", "epoll_wait_old", "eventfd", "eventfd2", "pipe", "pipe2",
)
_IPC = (
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd",
    "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
)
_NETWORK = (  # socket itself is allowed per family, below
    "socketpair", "bind", "connect", "listen", "accept", "accept4", "getsockname", "getpeername", "getsockopt",
    "setsockopt", "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "shutdown",
)
# Allowed because a default capability covers them.
_BY_DEFAULT_CAPABILITY = ("chroot",)  # CAP_SYS_CHROOT
# One architecture's own calls; a name this machine lacks is skipped.
_ARCH_OWN = ("arch_prctl", "modify_ldt", "riscv_hwprobe", "riscv_flush_icache")
_LANDLOCK = ("landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self")

ALLOWED = (*_FILES, *_XATTRS, *_MEMORY, *_PROCESSES, *_IDENTITY, *_SIGNALS, *_TIME, *_WAITING, *_IPC,
           *_NETWORK, *_BY_DEFAULT_CAPABILITY, *_ARCH_OWN)

# CLONE_NEWNS and CLONE_NEWCGROUP .. CLONE_NEWNET: a clone with any of them is refused.
CLONE_NAMESPACES = 0x7E020000
# Address families socket() refuses below 46: DECnet, Econet, ATM SVC, IrDA, WAN pipe, ISDN, CAIF, ALG, vsock.
REFUSED_FAMILIES = frozenset({12, 19, 20, 23, 25, 34, 37, 38, 40})
FIRST_UNLISTED_FAMILY = 46
# PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32, and the query (0xffffffff).
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

# Calls newer than some libseccomp still in use (Debian 12 ships 2.5.4): numbered alike on every
# architecture from 424 on, so they can be named by number.
_UNIFIED_NUMBERS = {
    "cachestat": 451, "fchmodat2": 452, "map_shadow_stack": 453, "futex_wake": 454, "futex_wait": 455,
    "futex_requeue": 456, "statmount": 457, "listmount": 458, "mseal": 462, "setxattrat": 463,
    "getxattrat": 464, "listxattrat": 465, "removexattrat": 466,
}
_UNIFIED_ARCHES = ("x86_64", "aarch64", "riscv64", "s390x", "ppc64le", "loongarch64")
_X86_64_ONLY = {"uretprobe": 335}

_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522


def _number(name: str) -> int | None:
    """The call's number on this machine, None when it has none (or libseccomp does not know it)."""
    number = int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name))
    if number >= 0:
        return number
    machine = platform.machine()
    if machine in _UNIFIED_ARCHES and name in _UNIFIED_NUMBERS:
        return _UNIFIED_NUMBERS[name]
    if machine == "x86_64" and name in _X86_64_ONLY:
        return _X86_64_ONLY[name]
    return None


def _allow(f: pyseccomp.SyscallFilter, names: Iterable[str], *args: pyseccomp.Arg) -> None:
    for name in names:
        number = _number(name)
        if number is not None:
            f.add_rule(pyseccomp.ALLOW, number, *args)


def build_filter(profile: str) -> pyseccomp.SyscallFilter:
    """The profile's filter, not yet loaded."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; one of {', '.join(PROFILES)}")
    f = pyseccomp.SyscallFilter(pyseccomp.ERRNO(errno.EPERM))
    f.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.ERRNO(errno.EPERM))
    f.set_attr(pyseccomp.Attr.CTL_NNP, 0)  # libseccomp sets no_new_privs unless told not to; Docker does not
    _allow(f, (*ALLOWED, *_X86_64_ONLY))
    if profile == "docker":
        _allow(f, _LANDLOCK)
    for family in range(FIRST_UNLISTED_FAMILY):
        if family not in REFUSED_FAMILIES:
            _allow(f, ("socket",), pyseccomp.Arg(0, pyseccomp.EQ, family))
    for persona in PERSONALITIES:
        _allow(f, ("personality",), pyseccomp.Arg(0, pyseccomp.EQ, persona))
    # s390x passes clone's flags second; this launcher is not run there.
    _allow(f, ("clone",), pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NAMESPACES, 0))
    f.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    return f


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _libc_call(result: int, what: str) -> None:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _keep_only_docker_capabilities() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    last = int(procfs.machine("sys/kernel/cap_last_cap"))
    for cap in range(last + 1):
        if not CAPABILITY_MASK & (1 << cap):
            _libc_call(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap} from the bounding set")
    _libc_call(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    low = CAPABILITY_MASK & 0xFFFFFFFF
    high = CAPABILITY_MASK >> 32
    data = (_CapData * 2)(_CapData(low, low, low), _CapData(high, high, high))
    _libc_call(libc.capset(ctypes.byref(header), data), "capset")


def enter(profile: str = "docker") -> None:
    """Make the calling (single-threaded) process what a container's process would be under ``profile``."""
    if os.geteuid() != 0:
        raise PermissionError(errno.EPERM, "the container setup needs root (it drops root's capabilities to "
                                           "Docker's, and installs the filter without no_new_privs)")
    os.setpriority(os.PRIO_PROCESS, 0, 0)
    build_filter(profile).load()  # while CAP_SYS_ADMIN still allows a filter without no_new_privs
    _keep_only_docker_capabilities()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    usage = f"usage: python -m tests.setups.container [--profile {'|'.join(PROFILES)}] -- COMMAND..."
    if "--" not in args:
        print(usage, file=sys.stderr)
        return 2
    split = args.index("--")
    options, command = args[:split], args[split + 1:]
    profile = "docker"
    if options[:1] == ["--profile"] and len(options) == 2:
        profile = options[1]
    elif options:
        print(usage, file=sys.stderr)
        return 2
    if profile not in PROFILES or not command:
        print(usage, file=sys.stderr)
        return 2
    try:
        enter(profile)
    except OSError as exc:
        print(f"container setup: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"container setup: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
