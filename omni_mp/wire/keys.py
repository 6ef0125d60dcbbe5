"""ZeroMQ CURVE keys: who may talk to a pipeline.

A key directory (`omni-mp keys DIR`) holds:

  server.key / server.key_secret       the identity every bound socket presents (coordinator, stages)
  internal.key / internal.key_secret   the identity the pipeline's own processes connect with
  stages/internal.key                  public keys allowed on stage links and the event socket
  clients/NAME.key                     public keys allowed on the client endpoint
  NAME.key_secret                      a client's keypair (hand it out with server.key)

Secret files are created 0600 (never readable by others, not even briefly). A socket that
binds requires CURVE and lets in only the public keys of its ZAP domain ("clients" or
"stages"), checked by a `zmq.auth` authenticator thread in each process that binds: a peer
without keys, or with keys not listed, cannot complete the handshake, so it can neither
submit, abort, nor inject stage frames.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

SERVER = "server"
INTERNAL = "internal"
CLIENTS_DIR = "clients"
STAGES_DIR = "stages"
# ZAP domains: which list of public keys a bound socket accepts.
CLIENT_DOMAIN = "clients"
STAGE_DOMAIN = "stages"
# Monitor events of a handshake that failed (missing, wrong or unlisted keys, or CURVE on
# one side only): both ends of the connection see one.
HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


class KeyFileError(ValueError):
    """A key directory is missing or incomplete; the message names the file."""


def _write(path: Path, text: str, mode: int) -> None:
    # O_EXCL + mode at creation: the secret is never on disk with wider permissions.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _cert(public: bytes, secret: bytes | None) -> str:
    # The ZPL format zmq.auth.load_certificate() reads.
    lines = ["#   ZeroMQ CURVE certificate (omni-mp keys)", "metadata", "curve"]
    lines.append(f'    public-key = "{public.decode()}"')
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def write_keypair(directory: Path, name: str, public_copy_in: Path | None = None) -> tuple[Path, Path]:
    """Create NAME.key (0644) and NAME.key_secret (0600) in `directory`; refuse to overwrite."""
    public, secret = zmq.curve_keypair()
    pub_path, sec_path = directory / f"{name}.key", directory / f"{name}.key_secret"
    _write(sec_path, _cert(public, secret), 0o600)
    _write(pub_path, _cert(public, None), 0o644)
    if public_copy_in is not None:
        public_copy_in.mkdir(mode=0o700, exist_ok=True)
        _write(public_copy_in / f"{name}.key", _cert(public, None), 0o644)
    return pub_path, sec_path


def generate(directory: Path, clients: list[str]) -> list[Path]:
    """Create a pipeline key directory (server and internal identities) and client keypairs.
    An existing directory keeps its pipeline keys; new clients are added to it."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    written: list[Path] = []
    if not (directory / f"{SERVER}.key_secret").exists():
        written += write_keypair(directory, SERVER)
        written += write_keypair(directory, INTERNAL, directory / STAGES_DIR)
        # The pipeline's own processes may also submit (the launcher's prompt runs).
        (directory / CLIENTS_DIR).mkdir(mode=0o700, exist_ok=True)
        _write(directory / CLIENTS_DIR / f"{INTERNAL}.key", (directory / f"{INTERNAL}.key").read_text(), 0o644)
    (directory / CLIENTS_DIR).mkdir(mode=0o700, exist_ok=True)
    for name in clients:
        if not name.isidentifier():
            raise KeyFileError(f"client name {name!r}: use letters, digits and '_'")
        written += write_keypair(directory, name, directory / CLIENTS_DIR)
    return written


def _load(path: Path, secret: bool) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        raise KeyFileError(f"{path}: no such key file (create the key directory with `omni-mp keys DIR`)")
    if secret and path.stat().st_mode & 0o077:
        raise KeyFileError(f"{path}: secret key readable by others (mode {path.stat().st_mode & 0o777:o}); chmod 600")
    public, sec = zmq.auth.load_certificate(path)
    if secret and sec is None:
        raise KeyFileError(f"{path}: holds no secret key")
    return public, sec


@dataclass(frozen=True)
class CurveIdentity:
    """The keys one process uses: its own keypair, the server key it expects when connecting,
    and, for a process that binds, its server keypair and the authorized-key directories."""

    public: bytes
    secret: bytes
    server_public: bytes
    server_secret: bytes | None = None
    key_dir: Path | None = None

    def client(self, sock: zmq.Socket) -> None:
        """Before connect: authenticate with our keypair, accept only the pipeline's server key."""
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        sock.curve_serverkey = self.server_public

    def server(self, sock: zmq.Socket, domain: str = STAGE_DOMAIN) -> None:
        """Before bind: require CURVE; the authenticator admits the public keys of `domain`."""
        if self.server_secret is None:
            raise KeyFileError("this identity cannot bind: it has no server secret key")
        sock.curve_server = True
        sock.curve_secretkey = self.server_secret
        sock.zap_domain = domain.encode()

    def start_authenticator(self, ctx: zmq.Context, domains: tuple[str, ...]) -> ThreadAuthenticator:
        """The ZAP handler of a process that binds: without it CURVE would admit any keypair."""
        assert self.key_dir is not None
        auth = ThreadAuthenticator(ctx, log=None)
        auth.start()
        for domain in domains:
            folder = CLIENTS_DIR if domain == CLIENT_DOMAIN else STAGES_DIR
            auth.configure_curve(domain=domain, location=str(self.key_dir / folder))
        return auth


def pipeline_identity(key_dir: str | Path) -> CurveIdentity:
    """The identity of the coordinator and of every stage process."""
    d = Path(key_dir)
    server_public, server_secret = _load(d / f"{SERVER}.key_secret", secret=True)
    public, secret = _load(d / f"{INTERNAL}.key_secret", secret=True)
    assert secret is not None
    for folder in (CLIENTS_DIR, STAGES_DIR):
        if not (d / folder).is_dir():
            raise KeyFileError(f"{d / folder}: missing (create the key directory with `omni-mp keys DIR`)")
    return CurveIdentity(public, secret, server_public, server_secret, d)


def client_identity(key_dir: str | Path, name: str) -> CurveIdentity:
    """A client's identity: NAME.key_secret and the pipeline's server.key, from one directory."""
    d = Path(key_dir)
    public, secret = _load(d / f"{name}.key_secret", secret=True)
    server_public, _ = _load(d / f"{SERVER}.key", secret=False)
    assert secret is not None
    return CurveIdentity(public, secret, server_public)


class SecureContext(zmq.Context):
    """A context whose link sockets (transport._LinkEnd) use this process's CURVE identity:
    code that makes links from a context (the stage loop's downstream links) gets CURVE
    without passing keys around. `curve` None: plain sockets (ipc without keys)."""

    curve: CurveIdentity | None = None
