"""ZeroMQ CURVE between frontends and an engine core: key files, keys from the environment, and
the socket settings on both sides. Imports no torch.

The engine core is the CURVE server: it holds a key pair and a set of frontend public keys it
accepts (checked by pyzmq's ZAP authenticator; anyone else never completes the handshake). A
frontend holds its own key pair and the core's public key, so it talks only to that core. CURVE
encrypts everything after the handshake.

Keys are Z85 text (40 characters). They come from files (written by `nvllm keys generate`, or
any ZeroMQ certificate, or a file holding just the key) or from environment variables:

  core:      NVLLM_CURVE_SERVER_SECRET_KEY, NVLLM_CURVE_AUTHORIZED_KEYS (frontend public keys,
             separated by commas or whitespace)
  frontend:  NVLLM_CURVE_CLIENT_SECRET_KEY (NVLLM_CURVE_CLIENT_PUBLIC_KEY, if set, must match it),
             NVLLM_CURVE_SERVER_PUBLIC_KEY

A flag naming a file wins over --curve-keys-dir, which wins over the environment.
"""

import logging
import os
import time
from dataclasses import dataclass

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from common.transport import is_loopback

logger = logging.getLogger("nvllm")

ENV_SERVER_SECRET = "NVLLM_CURVE_SERVER_SECRET_KEY"
ENV_SERVER_PUBLIC = "NVLLM_CURVE_SERVER_PUBLIC_KEY"
ENV_CLIENT_SECRET = "NVLLM_CURVE_CLIENT_SECRET_KEY"
ENV_CLIENT_PUBLIC = "NVLLM_CURVE_CLIENT_PUBLIC_KEY"
ENV_AUTHORIZED = "NVLLM_CURVE_AUTHORIZED_KEYS"

# the layout `nvllm keys generate DIR` writes
SERVER_NAME = "server"  # server.key (public: every frontend needs it), server.key_secret (the core only)
CLIENT_NAME = "frontend"  # frontend.key, frontend.key_secret (the frontends)
AUTHORIZED_DIR = "authorized"  # copies of the frontend public keys the core accepts


@dataclass(frozen=True)
class KeyPair:
    public: bytes  # Z85
    secret: bytes  # Z85


@dataclass(frozen=True)
class ServerKeys:
    keypair: KeyPair
    authorized: frozenset[bytes]  # Z85 public keys of the frontends the core accepts


@dataclass(frozen=True)
class ClientKeys:
    keypair: KeyPair
    server_public: bytes  # Z85 public key of the engine core


# ---- keys from text, files and the environment --------------------------------------------------

def parse_key(text: str | bytes, what: str) -> bytes:
    """A Z85 key (40 characters, 32 bytes decoded); ValueError naming `what` otherwise."""
    key = text.strip().strip("'\"" if isinstance(text, str) else b"'\"")
    key = key.encode("ascii", "replace") if isinstance(key, str) else key
    try:
        ok = len(key) == 40 and len(zmq.utils.z85.decode(key)) == 32
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"{what} is not a CURVE key (40 characters of Z85 text, as `nvllm keys generate` writes)")
    return key


def public_of(secret: bytes) -> bytes:
    return zmq.curve_public(secret)


def keypair_from_secret(secret: bytes, public: bytes | None = None, what: str = "secret key") -> KeyPair:
    derived = public_of(secret)
    if public is not None and public != derived:
        raise ValueError(f"the public key given with the {what} does not belong to it")
    return KeyPair(derived, secret)


def read_key_file(path: str, secret: bool) -> KeyPair | bytes:
    """A ZeroMQ certificate (public-key = "...", secret-key = "...") or a file holding one Z85 key.
    secret=True: the KeyPair of a secret key file; secret=False: the public key (Z85 bytes)."""
    what = f"{'secret' if secret else 'public'} key file {path}"
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} not found")
    with open(path, "rb") as f:
        text = f.read()
    if b"public-key" in text or b"secret-key" in text:
        public, secret_key = zmq.auth.load_certificate(path)
        public = parse_key(public, f"the public key in {path}")
        if not secret:
            return public
        if secret_key is None:
            raise ValueError(f"{what} holds only a public key (the secret one ends in .key_secret)")
        return keypair_from_secret(parse_key(secret_key, f"the secret key in {path}"), public, what)
    key = parse_key(text, f"the content of {path}")
    return keypair_from_secret(key, what=what) if secret else key


def read_public_keys(path: str) -> set[bytes]:
    """The public keys in one key file, or in every *.key file of a folder."""
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.endswith(".key"))
        return {read_key_file(os.path.join(path, n), secret=False) for n in names}
    return {read_key_file(path, secret=False)}


def _env_key(env, name: str) -> bytes | None:
    value = env.get(name, "").strip()
    return parse_key(value, f"${name}") if value else None


def _own_keypair(secret_key_file: str | None, keys_dir: str | None, name: str, env, env_secret: str,
                 env_public: str | None = None) -> KeyPair | None:
    """This side's key pair: from its secret key file, else <keys_dir>/<name>.key_secret, else the
    environment (a public key given there must match the secret); None when none is configured."""
    if secret_key_file:
        return read_key_file(secret_key_file, secret=True)
    if keys_dir:
        return read_key_file(os.path.join(keys_dir, f"{name}.key_secret"), secret=True)
    secret = _env_key(env, env_secret)
    if secret is None:
        return None
    return keypair_from_secret(secret, _env_key(env, env_public) if env_public else None, what=f"${env_secret}")


def server_keys(keys_dir: str | None = None, secret_key_file: str | None = None,
                authorized: str | None = None, env=None, need_authorized: bool = True) -> ServerKeys | None:
    """The core's CURVE keys, or None when none are configured (no CURVE)."""
    env = os.environ if env is None else env
    pair = _own_keypair(secret_key_file, keys_dir, SERVER_NAME, env, ENV_SERVER_SECRET)
    allowed: set[bytes] = set()
    if authorized:
        if not os.path.exists(authorized):
            raise FileNotFoundError(f"authorized keys {authorized} not found (a public key file or a folder of them)")
        allowed = read_public_keys(authorized)
    elif keys_dir and os.path.isdir(os.path.join(keys_dir, AUTHORIZED_DIR)):
        allowed = read_public_keys(os.path.join(keys_dir, AUTHORIZED_DIR))
    elif env.get(ENV_AUTHORIZED, "").strip():
        allowed = {parse_key(k, f"a key in ${ENV_AUTHORIZED}")
                   for k in env[ENV_AUTHORIZED].replace(",", " ").split()}
    if pair is None:
        if allowed:
            raise ValueError("frontend public keys were given but no secret key for the engine core: give "
                             f"--curve-secret-key, --curve-keys-dir or ${ENV_SERVER_SECRET}")
        return None
    if need_authorized and not allowed:
        raise ValueError("CURVE needs the public keys of the frontends the engine core accepts: give "
                         f"--curve-authorized-keys, --curve-keys-dir (with {AUTHORIZED_DIR}/) or ${ENV_AUTHORIZED}")
    return ServerKeys(pair, frozenset(allowed))


def client_keys(keys_dir: str | None = None, secret_key_file: str | None = None,
                server_key_file: str | None = None, env=None) -> ClientKeys | None:
    """A frontend's CURVE keys, or None when none are configured (no CURVE)."""
    env = os.environ if env is None else env
    pair = _own_keypair(secret_key_file, keys_dir, CLIENT_NAME, env, ENV_CLIENT_SECRET, ENV_CLIENT_PUBLIC)
    server = None
    if server_key_file:
        server = read_key_file(server_key_file, secret=False)
    elif keys_dir:
        server = read_key_file(os.path.join(keys_dir, f"{SERVER_NAME}.key"), secret=False)
    elif _env_key(env, ENV_SERVER_PUBLIC) is not None:
        server = _env_key(env, ENV_SERVER_PUBLIC)
    if pair is None and server is None:
        return None
    if pair is None:
        raise ValueError("the engine core's public key was given but no secret key for this frontend: give "
                         f"--curve-secret-key, --curve-keys-dir or ${ENV_CLIENT_SECRET}")
    if server is None:
        raise ValueError("this frontend's secret key was given but not the engine core's public key: give "
                         f"--curve-server-key, --curve-keys-dir or ${ENV_SERVER_PUBLIC}")
    return ClientKeys(pair, server)


def generate(folder: str, clients: list[str] | tuple[str, ...] = (CLIENT_NAME,), force: bool = False) -> list[str]:
    """Writes the core's key pair, a key pair per frontend name, and authorized/ (the frontend public
    keys the core accepts) into `folder`. Secret files are readable by their owner only."""
    for name in clients:
        if not name or name == SERVER_NAME or any(c in name for c in "/\\. ") or name.startswith("-"):
            raise ValueError(f"frontend name {name!r} must be a plain file name other than {SERVER_NAME!r}")
    os.makedirs(folder, exist_ok=True)
    names = [SERVER_NAME, *clients]
    existing = [os.path.join(folder, f"{n}.key_secret") for n in names
                if os.path.exists(os.path.join(folder, f"{n}.key_secret"))]
    if existing and not force:
        raise ValueError(f"{existing[0]} exists; keys are not overwritten unless --force is given")
    authorized = os.path.join(folder, AUTHORIZED_DIR)
    os.makedirs(authorized, exist_ok=True)
    written = []
    for name in names:
        public_file, secret_file = zmq.auth.create_certificates(folder, name)
        os.chmod(secret_file, 0o600)
        written += [public_file, secret_file]
        if name != SERVER_NAME:
            copy = os.path.join(authorized, f"{name}.key")
            write_public_key(copy, read_key_file(public_file, secret=False),
                             f"a frontend public key the engine core accepts ({name})")
            written.append(copy)
    return written


def write_public_key(path: str, public: bytes, comment: str) -> None:
    """A public key in ZeroMQ's certificate format (what zmq.auth.load_certificate reads)."""
    with open(path, "w", encoding="ascii") as f:
        f.write(f"#   {comment}\ncurve\n    public-key = \"{public.decode('ascii')}\"\n")


# ---- sockets ----------------------------------------------------------------------------------

def apply_server(sock: zmq.Socket, keys: ServerKeys) -> None:
    """Makes a socket (before bind) a CURVE server with the core's keys."""
    sock.curve_secretkey = keys.keypair.secret
    sock.curve_publickey = keys.keypair.public
    sock.curve_server = True


def apply_client(sock: zmq.Socket, keys: ClientKeys) -> None:
    """Makes a socket (before connect) a CURVE client that talks only to the core's public key."""
    sock.curve_secretkey = keys.keypair.secret
    sock.curve_publickey = keys.keypair.public
    sock.curve_serverkey = keys.server_public


def client_socket_setup(keys: ClientKeys | None):
    """A `socket_setup` hook for the engine-core clients (None: plain sockets)."""
    if keys is None:
        return None
    return lambda sock: apply_client(sock, keys)


class Authenticator:
    """pyzmq's ZAP authenticator on the core's context: a CURVE client is let in only when its public
    key is authorized. The core's own key pair is always accepted, so a health check on the core's
    host needs only the core's secret key."""

    LOG_EVERY_SECONDS = 60.0

    def __init__(self, ctx: zmq.Context, keys: ServerKeys):
        self.allowed = set(keys.authorized) | {keys.keypair.public}
        self._denied_logged: dict[bytes, float] = {}
        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger("nvllm.auth"))

    def start(self) -> None:
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        """Called by the authenticator thread with the client's Z85 public key."""
        if key in self.allowed:
            return True
        now = time.monotonic()
        if now - self._denied_logged.get(key, -self.LOG_EVERY_SECONDS) >= self.LOG_EVERY_SECONDS:
            if len(self._denied_logged) > 1000:
                self._denied_logged.clear()
            self._denied_logged[key] = now
            logger.warning("refused a frontend whose CURVE public key %s is not authorized", key.decode("ascii"))
        return False

    def stop(self) -> None:
        self._auth.stop()


# ---- who may listen where -----------------------------------------------------------------------

def check_listen_security(listen: str, keys: ServerKeys | None, allow_insecure: bool) -> None:
    """A core on a non-loopback address without CURVE starts only with --allow-insecure (and warns)."""
    if keys is not None or is_loopback(listen):
        return
    if not allow_insecure:
        raise ValueError(
            f"--listen {listen} is reachable from other hosts, and without CURVE anyone who can reach it may "
            "use the engine and read every prompt and output: give CURVE keys (`nvllm keys generate DIR`, then "
            "--curve-keys-dir DIR) or, on a network you trust, --allow-insecure")
    logger.warning("!" * 100)
    logger.warning("INSECURE: the engine core listens on %s without CURVE (--allow-insecure): anyone who can "
                   "reach it may use the engine and read every prompt and output", listen)
    logger.warning("!" * 100)
