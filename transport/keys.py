"""The keyring: one random HMAC key per role instance, plus CURVE keypairs for tcp endpoints.

The supervisor issues keys (:meth:`Keyring.issue`, :meth:`Keyring.issue_curve`) into one
owner-only file under the org home's ``run/`` folder (file 0600, folder 0700); every role process
loads it by path. Keys never travel through environment variables, so a child a role starts does
not inherit them, and the sandbox hides the org home from agent commands.

File format (JSON): ``{"v": 1, "keys": {instance: hex}, "curve": {instance: {"public": z85,
"secret": z85}}}``.
"""
from __future__ import annotations

import fcntl
import os
import stat
from contextlib import contextmanager
from pathlib import Path

import orjson

from transport.errors import Code, KeyringError
from transport.kinds import role_of

_FORMAT = 1
KEYRING_NAME = "keys.json"


def keyring_path(run_dir: Path | str) -> Path:
    """Where the keyring lives: ``<org home>/run/keys.json``."""
    return Path(run_dir) / KEYRING_NAME


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if needed and make it owner-only (0700).

    Raises:
        KeyringError(keyring_unsafe): the folder belongs to another user.
    """
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_uid != os.geteuid():
        raise KeyringError(Code.KEYRING_UNSAFE,
                           f"{path} belongs to uid {st.st_uid}; use an org home you own",
                           path=str(path))
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``, readable by the owner only (temp, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class Keyring:
    """HMAC keys and CURVE keypairs by instance name, backed by one owner-only file.

    Use :meth:`create` (supervisor, once) or :meth:`load` (every process).
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._keys: dict[str, bytes] = {}
        self._curve: dict[str, tuple[bytes, bytes]] = {}
        self._curve_owner: dict[bytes, str] = {}
        self._stamp: tuple[int, int, int] | None = None
        self.peers = None       # transport.peers.StorePeers: instances on other hosts (tcp orgs)

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def create(cls, path: Path | str) -> Keyring:
        """Open the keyring at ``path``, creating an empty one (and an owner-only folder) if absent.

        Raises:
            KeyringError: keyring_unsafe / keyring_corrupt (see :meth:`load`).
        """
        ring = cls(path)
        ensure_private_dir(ring.path.parent)
        with ring._locked():
            if not ring.path.exists():
                ring._write()
            ring._read()
        return ring

    @classmethod
    def load(cls, path: Path | str) -> Keyring:
        """Load the keyring a supervisor issued.

        Raises:
            KeyringError(keyring_missing): no file at ``path`` (start the org with start-org).
            KeyringError(keyring_unsafe): the file or its folder is readable by others.
            KeyringError(keyring_corrupt): the file is not a keyring.
        """
        ring = cls(path)
        ring._read()
        return ring

    # -- lookups (hot path) ----------------------------------------------------------------

    def attach_peers(self, peers) -> "Keyring":
        """Also know the instances registered by other hosts (``transport.peers.StorePeers``);
        this file's own keys always win."""
        self.peers = peers
        return self

    def key_for(self, instance: str) -> bytes | None:
        """The HMAC key of ``instance``, or None if none was issued."""
        key = self._keys.get(instance)
        if key is None and self.peers is not None and (peer := self.peers.get(instance)) is not None:
            return peer.hmac_key
        return key

    def require_key(self, instance: str) -> bytes:
        """The HMAC key of ``instance``.

        Raises:
            KeyringError(unknown_key): none issued; the supervisor issues one per instance.
        """
        key = self._keys.get(instance)
        if key is None and self.refresh():
            key = self._keys.get(instance)
        if key is None:
            raise KeyringError(Code.UNKNOWN_KEY,
                               f"no key issued for {instance!r} in {self.path}; the supervisor "
                               "issues one per instance (Keyring.issue)", path=str(self.path))
        return key

    def curve_keypair(self, instance: str) -> tuple[bytes, bytes] | None:
        """``(public, secret)`` z85 CURVE keys of ``instance``, or None."""
        pair = self._curve.get(instance)
        if pair is None and self.refresh():
            pair = self._curve.get(instance)
        if pair is None and self.peers is not None and instance not in self._keys:
            peer = self.peers.get(instance)
            if peer is None and self.peers.refresh():
                peer = self.peers.get(instance)
            if peer is not None:
                return peer.curve_public, b""       # another host's: its public key only
        return pair

    def curve_owner(self, public_z85: bytes) -> str | None:
        """The instance whose CURVE public key is ``public_z85``, or None (refreshes once)."""
        owner = self._curve_owner.get(public_z85)
        if owner is None and self.refresh():
            owner = self._curve_owner.get(public_z85)
        if owner is None and self.peers is not None:
            owner = self.peers.owner(public_z85)
            if owner is None and self.peers.refresh():
                owner = self.peers.owner(public_z85)
            if owner is not None and (owner in self._keys or owner in self._curve):
                return None                         # a row claiming a name this host issued
        return owner

    def instances(self) -> list[str]:
        """Instances holding an HMAC key, sorted."""
        return sorted(self._keys)

    def refresh(self) -> bool:
        """Reload the file if it changed since it was read; True if it did.

        Costs one stat() when nothing changed, so it may be called on every unknown key.
        """
        peers = self.peers.refresh() if self.peers is not None else False
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return peers
        if (st.st_ino, st.st_mtime_ns, st.st_size) == self._stamp:
            return peers
        try:
            self._read()
        except KeyringError:
            return peers  # keep the keys we have; a half-written file is not ours to judge
        return True

    # -- issuing (supervisor) --------------------------------------------------------------

    def issue(self, instance: str) -> bytes:
        """Issue a new random key for ``instance`` (replacing any older one) and persist it.

        Raises:
            BadInstance: not an instance name.
        """
        role_of(instance)
        with self._locked():
            self._read()
            key = os.urandom(32)
            self._keys[instance] = key
            self._write()
        return key

    def issue_curve(self, instance: str) -> tuple[bytes, bytes]:
        """Issue a CURVE keypair for ``instance`` (for tcp:// endpoints) and persist it."""
        import zmq  # only tcp set-ups need CURVE

        role_of(instance)
        with self._locked():
            self._read()
            public, secret = zmq.curve_keypair()
            self._curve[instance] = (public, secret)
            self._write()
        self._index_curve()
        return public, secret

    def revoke(self, instance: str) -> None:
        """Forget every key of ``instance``; its later messages are ``not_authenticated``."""
        with self._locked():
            self._read()
            self._keys.pop(instance, None)
            self._curve.pop(instance, None)
            self._write()

    # -- file ------------------------------------------------------------------------------

    @contextmanager
    def _locked(self):
        lock = self.path.with_name(f".{self.path.name}.lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self) -> None:
        path = self.path
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise KeyringError(Code.KEYRING_MISSING,
                               f"no keyring at {path}; start the org (scripts/start-org) so the "
                               "supervisor issues keys", path=str(path)) from None
        try:
            st = os.fstat(fd)
            dir_mode = stat.S_IMODE(path.parent.stat().st_mode)
            if stat.S_IMODE(st.st_mode) & 0o077 or dir_mode & 0o077 or st.st_uid != os.geteuid():
                raise KeyringError(Code.KEYRING_UNSAFE,
                                   f"{path} must be owned by you and private: chmod 600 {path}; "
                                   f"chmod 700 {path.parent}", path=str(path))
            raw = b""
            while chunk := os.read(fd, 1 << 16):
                raw += chunk
        finally:
            os.close(fd)
        try:
            doc = orjson.loads(raw)
            if doc.get("v") != _FORMAT:
                raise ValueError(f"format {doc.get('v')!r}")
            keys = {name: bytes.fromhex(k) for name, k in doc["keys"].items()}
            curve = {name: (p["public"].encode(), p["secret"].encode())
                     for name, p in doc.get("curve", {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise KeyringError(Code.KEYRING_CORRUPT,
                               f"{path} is not a loop-org keyring ({e}); stop the org and let "
                               "start-org issue new keys", path=str(path)) from None
        self._keys, self._curve = keys, curve
        self._index_curve()
        self._stamp = (st.st_ino, st.st_mtime_ns, st.st_size)

    def _index_curve(self) -> None:
        self._curve_owner = {pub: name for name, (pub, _) in self._curve.items()}

    def _write(self) -> None:
        doc = {
            "v": _FORMAT,
            "keys": {name: k.hex() for name, k in sorted(self._keys.items())},
            "curve": {name: {"public": p.decode(), "secret": s.decode()}
                      for name, (p, s) in sorted(self._curve.items())},
        }
        write_private(self.path, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
