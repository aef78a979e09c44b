"""Coordinator epochs that cannot be forged, and where a new one comes from.

Every coordinator start takes an epoch; every command carries it, and workers
and the trainer ignore commands from an epoch older than the newest they have
accepted. They also tell a coordinator the newest epoch they have seen when
they connect, and a coordinator that hears of a newer one stops steering
(it is *fenced*). That report must not be forgeable, or any peer could fence
the live coordinator with one message (``epoch_seen=2**62``). So:

* an epoch is *issued* with a proof: HMAC-SHA256 keyed with the peer token
  over (job, epoch, coordinator id), computed by the coordinator that takes it
  (:func:`proof`). Workers and the trainer keep the proof with the epoch and
  echo it when they report the epoch (``Register.epoch_seen_*``,
  ``TrainerHello.epoch_*``);
* a coordinator believes a newer epoch only if its proof verifies with its own
  peer token (:func:`verify`); a claim that does not is logged and ignored.
  Without ``--peer-token-file`` the key is a fixed, public one: proofs then only
  catch corrupted or made-up numbers, not a deliberate forger (who could also
  register as any worker without a token);
* a new epoch rests on what was issued before, not on the clock alone
  (:func:`next_epoch`): one above the state file's. Only a coordinator with no
  state file falls back to the wall clock (milliseconds), as a floor; such a
  *blind* one that then hears a verified epoch above its own before it has
  steered anything takes the next epoch above that instead of being fenced by
  its own workers (a wall clock behind the previous coordinator's).
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid

from agent.auth import BearerToken

_PUBLIC_KEY = b"elastic-sidecar epoch proof without a peer token"


def _key(token: BearerToken | None) -> bytes:
    if token is None:
        return _PUBLIC_KEY
    # The token's own bytes, as presented in its call metadata ("Bearer <token>").
    return token.metadata()[0][1].encode("ascii")


def _message(job: str, epoch: int, coordinator: str) -> bytes:
    return f"elastic-sidecar epoch\0{job}\0{epoch}\0{coordinator}".encode()


def proof(token: BearerToken | None, job: str, epoch: int, coordinator: str) -> bytes:
    """The proof that ``coordinator`` issued ``epoch`` for ``job``."""
    return hmac.new(_key(token), _message(job, epoch, coordinator), hashlib.sha256).digest()


def verify(token: BearerToken | None, job: str, epoch: int, coordinator: str, claimed: bytes) -> bool:
    """Whether ``claimed`` proves that ``coordinator`` issued ``epoch`` for ``job`` (constant time)."""
    if epoch <= 0 or not coordinator or not claimed:
        return False
    return hmac.compare_digest(proof(token, job, epoch, coordinator), claimed)


def new_coordinator_id() -> str:
    """A fresh id for one coordinator process (its epochs are issued under it)."""
    return uuid.uuid4().hex[:16]


def next_epoch(file_epoch: int | None, seen: int = 0, wall_ms: int | None = None) -> int:
    """The epoch a starting coordinator takes.

    ``file_epoch``: the epoch in its state file (None: no usable state file);
    ``seen``: the highest verified epoch it knows of. With a state file the wall
    clock plays no part; without one it is the floor (a tie-break between blind
    starts), never lower than anything seen.
    """
    base = max(file_epoch or 0, seen) + 1
    if file_epoch is not None:
        return base
    return max(base, int(time.time() * 1000) if wall_ms is None else wall_ms)


class Epoch:
    """One coordinator process's epoch, its proof, and the newer epoch that fenced it (0: none)."""

    def __init__(self, token: BearerToken | None, job: str) -> None:
        self.token = token
        self.job = job
        self.coordinator_id = new_coordinator_id()
        """Who issues this process's epochs (part of their proof)."""
        self.epoch = 0
        """It grows at every coordinator start."""
        self.proof = b""
        self.fenced_by = 0
        """A newer coordinator's epoch, once a participant reported one: this one no longer steers."""
        self.blind = True
        """Started with no usable state file: its epoch rests on the wall clock."""
        self.steered = False
        """A command went to the trainer or the workers (a blind epoch can no longer be moved)."""
        self.claims_ignored = 0

    def take(self, epoch: int) -> None:
        self.epoch = epoch
        self.proof = proof(self.token, self.job, epoch, self.coordinator_id)

    def claim(self, epoch: int, coordinator: str, claimed: bytes) -> str:
        """A participant says it has seen ``epoch``: ``"older"`` (not above ours), ``"unproven"`` (its proof
        does not verify: ignored), ``"moved"`` (a blind start that has not steered took the next epoch above
        it) or ``"fenced"`` (a newer coordinator exists: the caller stops steering)."""
        if epoch <= self.epoch:
            return "older"
        if not verify(self.token, self.job, epoch, coordinator, claimed):
            self.claims_ignored += 1
            return "unproven"
        if self.blind and not self.steered and not self.fenced_by:
            self.take(next_epoch(None, seen=epoch))
            return "moved"
        return "fenced"
