"""The system-call filter every sandboxed command runs under (bubblewrap's ``--seccomp FD``).

The profile (default: allow; every rule answers ``EPERM`` unless noted, so a refused tool prints
"Operation not permitted" instead of dying):

- **No new namespaces from inside.** ``unshare`` and ``clone`` with ``CLONE_NEWUSER`` (a nested
  user namespace hands back every capability within it, the usual first step of a kernel
  exploit; ``unshare -r`` is the shell's way of asking), ``setns`` (joining another namespace),
  and ``clone3`` answered with ``ENOSYS``: its flags live in memory a filter cannot read, and
  ``ENOSYS`` makes the C library fall back to ``clone``, which is filtered.
- **No looking into other processes.** ``ptrace``, ``process_vm_readv``/``writev``,
  ``kcmp``, ``pidfd_getfd``.
- **No kernel keyrings.** ``keyctl``, ``add_key``, ``request_key`` (shared across the
  machine's user namespaces for the same uid).
- **No file-system reshaping.** ``mount``, ``umount2``, ``pivot_root``, ``chroot``,
  ``move_mount``, ``open_tree``, ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``,
  ``mount_setattr``, ``open_by_handle_at``, ``name_to_handle_at``.
- **No kernel extension points.** ``bpf``, ``perf_event_open``, ``userfaultfd``,
  ``kexec_load``, ``kexec_file_load``, ``init_module``, ``finit_module``, ``delete_module``,
  ``iopl``, ``ioperm``, ``swapon``, ``swapoff``, ``reboot``, ``acct``, ``quotactl``,
  ``syslog``, ``settimeofday``, ``clock_settime``, ``clock_adjtime``, ``uselib``,
  ``lookup_dcookie``, ``vhangup``. (``adjtimex`` stays: without ``CAP_SYS_TIME`` it only reads.)
- **No io_uring.** ``io_uring_setup``, ``io_uring_enter``, ``io_uring_register``: a large
  kernel surface of its own, with a history of privilege escalations, that no toolchain needs
  (Docker's default profile refuses it too). Programs that try it fall back to plain calls.
- **No way past the network namespace.** ``socket`` for ``AF_VSOCK``: virtual-machine sockets
  are not namespaced, so they would reach the hypervisor's host with the network block on.
- **No obsolete or never-implemented calls** (``_sysctl``, ``sysfs``, ``ustat``, ``nfsservctl``,
  the module calls of old kernels, ``afs_syscall``…), ``fanotify_init`` (watches the whole
  file system it is given), ``quotactl_fd`` and ``process_madvise`` (acts on another process).
- **Native architecture only.** A system call made through another ABI (``int 0x80`` on
  x86-64) kills the process: libseccomp's default for an architecture the filter does not list.

Checked against Docker's default profile (``tests/test_seccomp_docker.py``): every call Docker
refuses without a capability is refused here too, or listed in ``DOCKER_DIFFERENCES`` with the
reason it may stay.

Built with libseccomp (through ``pyseccomp``, its ctypes binding) rather than by hand: it
knows each architecture's system-call numbers and emits the architecture checks.
"""
from __future__ import annotations

import errno
import functools
import os

from roles.workbench.sandbox.errors import SandboxUnavailable

CLONE_NEWUSER = 0x10000000
REFUSED = (
    "setns", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "keyctl", "add_key", "request_key",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "open_by_handle_at", "name_to_handle_at",
    "bpf", "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "iopl", "ioperm", "swapon", "swapoff", "reboot", "acct", "quotactl", "syslog",
    "settimeofday", "clock_settime", "clock_adjtime", "uselib", "lookup_dcookie", "vhangup",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "fanotify_init", "quotactl_fd", "process_madvise",
    "_sysctl", "sysfs", "ustat", "nfsservctl", "create_module", "get_kernel_syms", "query_module", "afs_syscall",
    "tuxcall", "vserver", "security", "putpmsg", "getpmsg",
)
AF_VSOCK = 40
# What Docker's default profile refuses (without a capability) and this one allows, and why.
DOCKER_DIFFERENCES = {
    "clone": "refused here when it asks for a new user namespace (the one flag that gives capabilities back); "
             "every other namespace flag needs CAP_SYS_ADMIN, which the sandbox has dropped (--cap-drop ALL)",
    "unshare": "as clone: CLONE_NEWUSER refused here, the rest refused by the kernel without CAP_SYS_ADMIN",
    "socket": "allowed for every family but AF_VSOCK (refused here, as in Docker): the network block is the "
              "network namespace, which AF_UNIX, AF_INET and AF_NETLINK sockets stay inside",
    "personality": "changes only the calling process's execution domain (e.g. ADDR_NO_RANDOMIZE for a debugger "
                   "inside): nothing outside the sandbox reads it",
    "sethostname": "the sandbox has its own UTS namespace (--unshare-uts): the name changes there only",
    "setdomainname": "as sethostname: its own UTS namespace",
    "get_mempolicy": "NUMA policy of the caller's own memory; the JVM and NUMA-aware numeric libraries ask for it",
    "set_mempolicy": "NUMA policy of the caller's own memory (as get_mempolicy)",
    "set_mempolicy_home_node": "NUMA policy of the caller's own memory (as get_mempolicy)",
    "mbind": "NUMA policy of a range of the caller's own memory (as get_mempolicy)",
    "move_pages": "moves pages of processes the caller may ptrace-read, which inside the sandbox's pid namespace "
                  "are its own (and ptrace itself is refused)",
    "migrate_pages": "as move_pages: only the sandbox's own processes are there to name",
}
_WITH_FLAGS = ("unshare", "clone")      # refused only when arg 0 asks for a new user namespace
_FIX = ("install libseccomp (Debian/Ubuntu: apt-get install libseccomp2) and the project's dependencies "
        "(pip install pyseccomp)")


@functools.lru_cache(maxsize=1)
def program() -> bytes:
    """The compiled BPF program of the profile above, for ``--seccomp``.

    Errors: ``SandboxUnavailable`` (code ``seccomp_unavailable``) when libseccomp or its binding
    is missing — agent commands are then refused rather than run unfiltered.
    """
    try:
        import pyseccomp as sc
        flt = sc.SyscallFilter(sc.ALLOW)
    except (ImportError, OSError, RuntimeError) as exc:
        raise SandboxUnavailable(f"the sandbox's system-call filter cannot be built ({exc}); {_FIX}",
                                 code="seccomp_unavailable") from exc
    denied = sc.ERRNO(errno.EPERM)
    for name in REFUSED:
        _add(sc, flt, denied, name)
    for name in _WITH_FLAGS:
        _add(sc, flt, denied, name, sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    _add(sc, flt, sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.EQ, AF_VSOCK))
    _add(sc, flt, sc.ERRNO(errno.ENOSYS), "clone3")
    fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
    try:
        flt.export_bpf(_Fd(fd))
        size = os.lseek(fd, 0, os.SEEK_END)
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def _add(sc, flt, action: int, name: str, *args) -> None:
    try:
        number = sc.resolve_syscall(sc.Arch.NATIVE, name)
    except Exception:  # noqa: BLE001 - a call this architecture lacks (e.g. iopl on arm64) needs no rule
        return
    if number < 0:
        return
    flt.add_rule(action, number, *args)


class _Fd:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd


def memfd(data: bytes, name: str) -> int:
    """An inheritable file descriptor holding ``data`` at offset 0 (bubblewrap reads
    ``--seccomp`` and ``--args`` descriptors from their current offset). The caller closes it."""
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
