"""Who may speak in a Di-PS run: the run's secret, a credential per participant derived from it, signed
control calls, and the data flow's CURVE keys.

The run secret (32 random bytes, `h2 ps launch` writes it to `<out>/secrets/run.secret`, mode 0600) is
held by the master only. Each participant — `shard/<i>`, `cluster/<id>` — holds its own key,
HMAC-SHA256(run secret, "h2-ps participant " + name) (`<out>/secrets/<name>.key`); a process may also be
handed the run secret itself and derive its key from it. The master derives every participant's key
from the secret, so nothing secret travels on the network.

Control flow (gRPC): every call carries metadata — the caller's name, a timestamp, a random nonce and
HMAC-SHA256 under the caller's key (calls from the master to shard i: under shard i's key) over the
method, those fields and the SHA-256 of the request bytes. The server recomputes it before it reads the
request, refuses a timestamp outside REPLAY_WINDOW_S and a nonce it has already seen within it (a
replayed call), and signs its reply (trailing metadata: HMAC over the request's MAC and the reply's
SHA-256) so that a reply cannot be forged or swapped either. The calls are authenticated, not encrypted.

Data flow (ZeroMQ): CURVE (libzmq's CurveZMQ, pyzmq's `zmq.auth`): each shard's and each cluster's
key pair is derived from its key; a shard admits only the clusters' public keys (the master tells it
which, in its authenticated plan) and names each connection's cluster (ZAP User-Id), so a push is
accepted only under a ticket issued to that cluster; a cluster accepts only the shard's public key the
master announced. Layers travel encrypted and authenticated.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import threading
import time
from dataclasses import dataclass
from typing import Callable

import zmq
from zmq.utils import z85

from h2.core.dips import SECRET_ENV
from h2.core.errors import UserError

MASTER = "master"
REPLAY_WINDOW_S = 120.0
MAX_REMEMBERED_NONCES = 1_000_000
_HEADER_CALLER, _HEADER_TIME, _HEADER_NONCE, _HEADER_MAC = "h2ps-caller", "h2ps-time", "h2ps-nonce", "h2ps-mac"
REPLY_MAC = "h2ps-reply-mac"


def shard_name(index: int) -> str:
    return f"shard/{index}"


def cluster_name(cluster_id: str) -> str:
    return f"cluster/{cluster_id}"


def _mac(key: bytes, *parts: bytes) -> str:
    return hmac.new(key, b"\0".join(parts), hashlib.sha256).hexdigest()


def participant_key(run_secret: bytes, participant: str) -> bytes:
    return hmac.new(run_secret, b"h2-ps participant " + participant.encode(), hashlib.sha256).digest()


def curve_keys(key: bytes) -> tuple[bytes, bytes]:
    """(public, secret) CURVE key pair, Z85-encoded, derived from a participant's key."""
    secret = z85.encode(hmac.new(key, b"h2-ps curve", hashlib.sha256).digest())
    return zmq.curve_public(secret), secret


@dataclass(frozen=True)
class Credential:
    """A participant's name and key; the master's (or a process handed the whole run secret) also holds
    the run secret and so can speak as, and check, anyone."""
    participant: str
    key: bytes
    run_secret: bytes | None = None

    def key_of(self, participant: str) -> bytes:
        if self.run_secret is not None:
            return participant_key(self.run_secret, participant)
        if participant == self.participant:
            return self.key
        raise UserError(f"the credential of {self.participant} cannot speak for {participant}")

    def signer(self, audience: str | None = None) -> "Signer":
        """Signs this participant's calls; `audience`: the master signing a call to shard `audience`."""
        return Signer(self.participant, self.key_of(audience or self.participant))

    @property
    def curve(self) -> tuple[bytes, bytes]:
        return curve_keys(self.key)


def master_credential(run_secret: bytes) -> Credential:
    return Credential(MASTER, run_secret, run_secret)


# ---- files ------------------------------------------------------------------------------------------
def _write_private(path: str, data: dict) -> None:
    temporary = f"{path}.tmp{os.getpid()}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
        handle.write("\n")
    os.replace(temporary, path)


def write_run_secrets(folder: str, shards: int, cluster_ids: list[str], run_secret: bytes | None = None) -> str:
    """A fresh run secret in `folder`/run.secret and each participant's key file beside it (folder 0700,
    files 0600); the run secret's path. An existing run.secret is kept (a resumed run keeps its keys)."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    path = os.path.join(folder, "run.secret")
    if run_secret is None:
        run_secret = load_secret_file(path, MASTER).run_secret if os.path.exists(path) else secrets.token_bytes(32)
    _write_private(path, {"h2_ps": "run_secret", "secret": run_secret.hex()})
    for name in [shard_name(i) for i in range(shards)] + [cluster_name(c) for c in cluster_ids]:
        _write_private(participant_file(folder, name),
                       {"h2_ps": "credential", "participant": name, "key": participant_key(run_secret, name).hex()})
    return path


def participant_file(folder: str, participant: str) -> str:
    return os.path.join(folder, participant.replace("/", "-") + ".key")


def load_secret_file(path: str, participant: str) -> Credential:
    """`participant`'s credential from a run secret file or from its own key file; one-line UserErrors."""
    try:
        mode = os.stat(path).st_mode
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as error:
        raise UserError(f"{path}: cannot read the Di-PS secret ({error.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{path}: not a Di-PS secret file (expected the JSON that h2 ps launch writes)") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UserError(f"{path}: a Di-PS secret must be readable by its owner only (chmod 600), "
                        f"its mode is {stat.S_IMODE(mode):o}")
    malformed = UserError(f"{path}: not a Di-PS secret file (expected the JSON that h2 ps launch writes)")
    try:
        kind, owner = data["h2_ps"], data.get("participant")
        key = bytes.fromhex(data["secret"] if kind == "run_secret" else data["key"])
    except (AttributeError, KeyError, TypeError, ValueError):
        raise malformed from None
    if kind == "run_secret":
        return master_credential(key) if participant == MASTER else Credential(participant,
                                                                               participant_key(key, participant), key)
    if kind != "credential":
        raise malformed
    if owner != participant:
        raise UserError(f"{path}: holds the credential of {owner}, not of {participant}")
    return Credential(participant, key)


def load_credential(path: str | None, participant: str, flag: str = "--secret-file") -> Credential:
    """From `path`, else from $H2_PS_SECRET_FILE; without either, one line naming both."""
    path = path or os.environ.get(SECRET_ENV)
    if not path:
        raise UserError(f"{participant} needs the run's Di-PS secret: pass {flag} FILE or set {SECRET_ENV} "
                        f"(h2 ps launch writes them to <out>/secrets/)")
    return load_secret_file(path, participant)


# ---- signed calls -----------------------------------------------------------------------------------
class NotAuthenticated(Exception):
    """A call without a valid signature, or replayed; one line."""


@dataclass(frozen=True)
class Signer:
    """Signs the calls of `participant` under `key`."""
    participant: str
    key: bytes

    def sign(self, method: str, body: bytes) -> tuple[list[tuple[str, str]], str]:
        stamp, nonce = f"{time.time():.6f}", secrets.token_hex(16)
        mac = _mac(self.key, b"h2-ps call", method.encode(), self.participant.encode(), stamp.encode(), nonce.encode(),
                   hashlib.sha256(body).digest())
        return [(_HEADER_CALLER, self.participant), (_HEADER_TIME, stamp), (_HEADER_NONCE, nonce),
                (_HEADER_MAC, mac)], mac

    def reply_is_authentic(self, request_mac: str, body: bytes, reply_mac: str | None) -> bool:
        return reply_mac is not None and hmac.compare_digest(reply_mac, reply_signature(self.key, request_mac, body))


def reply_signature(key: bytes, request_mac: str, body: bytes) -> str:
    return _mac(key, b"h2-ps reply", request_mac.encode(), hashlib.sha256(body).digest())


class Guard:
    """The server's side: which callers it admits (`key_of(name)`: their key, or None) and the nonces
    seen within the replay window."""

    def __init__(self, key_of: Callable[[str], bytes | None], window_s: float = REPLAY_WINDOW_S):
        self.key_of, self.window_s = key_of, window_s
        self.lock = threading.Lock()
        self.seen: dict[tuple[str, str], float] = {}
        self.next_prune = 0.0

    def check(self, method: str, metadata, body: bytes) -> tuple[str, bytes, str]:
        """(caller, its key, the request's MAC) of an authentic, fresh call; NotAuthenticated otherwise."""
        fields = {key: value for key, value in metadata or () if key.startswith("h2ps-")}
        caller, stamp, nonce, mac = (fields.get(name)
                                     for name in (_HEADER_CALLER, _HEADER_TIME, _HEADER_NONCE, _HEADER_MAC))
        if not (caller and stamp and nonce and mac):
            raise NotAuthenticated("not authenticated: the call carries no Di-PS signature")
        key = self.key_of(caller)
        expected = _mac(key or b"\0" * 32, b"h2-ps call", method.encode(), caller.encode(), stamp.encode(),
                        nonce.encode(),
                        hashlib.sha256(body).digest())
        if key is None or not hmac.compare_digest(mac, expected):
            raise NotAuthenticated(f"not authenticated: bad signature for caller {caller[:64]!r}")
        try:
            skew = time.time() - float(stamp)
        except ValueError:
            raise NotAuthenticated("not authenticated: malformed timestamp") from None
        if not abs(skew) <= self.window_s:
            raise NotAuthenticated(f"not authenticated: the call's timestamp is {skew:+.0f} s off this host's clock "
                                   f"(allowed {self.window_s:g} s; replayed, or clocks differ)")
        self._remember(caller, nonce)
        return caller, key, mac

    def _remember(self, caller: str, nonce: str) -> None:
        now = time.monotonic()
        with self.lock:
            if now >= self.next_prune or len(self.seen) >= MAX_REMEMBERED_NONCES:
                self.seen = {entry: until for entry, until in self.seen.items() if until > now}
                self.next_prune = now + self.window_s / 4
            if (caller, nonce) in self.seen:
                raise NotAuthenticated("not authenticated: a replayed call (its nonce was already used)")
            if len(self.seen) >= MAX_REMEMBERED_NONCES:
                raise NotAuthenticated("too many calls within the replay window: try again")
            self.seen[(caller, nonce)] = now + 2 * self.window_s
