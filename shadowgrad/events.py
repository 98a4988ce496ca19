"""The names of the structured events (:func:`shadowgrad._log.event`), in one place.

An event is a log record with a dotted name and JSON fields (``shadowgrad._log``); operators
count and alert on them, and the scenario reports, the soak tool and the tests read them by
name. Every event the library emits is named by a constant here (grouped by the component that
emits it; each says what it means and the fields it carries besides the ones every emitter
adds, such as ``shadow`` for a shadow's events and ``rank`` for a trainer's). The call sites
use the constants; tests/test_events.py checks that no event is named by a literal in the
library and that every constant is emitted somewhere. Standard library only.
"""

from __future__ import annotations

__all__ = ["HOLD_EVENTS", "all_names"]

# ------------------------------------------------------------------------------- control server

CONTROL_BAD_TOKEN = "control.control_bad_token"
"""A control request with a wrong or missing job token, refused (a control server that is no
shadow's or controller's). Fields: ``op``."""

# ------------------------------------------------------------------------------- shadow

SHADOW_STARTING = "shadow.starting"
"""A shadow process bound its control endpoint and answers while it imports torch. Fields:
``control`` (the endpoint)."""

SHADOW_START = "shadow.start"
"""A shadow node is up. Fields: ``data`` (its data address), ``control``."""

SHADOW_STOP = "shadow.stop"
"""A shadow node stopped."""

SHADOW_CONTROL_BAD_TOKEN = "shadow.control_bad_token"
"""A shadow refused a control request with a wrong or missing job token. Fields: ``op``."""

SHADOW_ISTAR = "shadow.istar"
"""The shadow's own view of I* (the cut over the shards' ready iterations) moved. Fields:
``istar``."""

SHADOW_REPAIR = "shadow.repair"
"""The shadow asked the trainers to resend what it misses of an iteration (a NACK). Fields:
``iteration``, ``ranges`` (byte ranges missing), ``commit_missing``."""

SHADOW_REPAIR_WAITING = "shadow.repair_waiting"
"""A gap is not repaired because the trainers are silent: the shadow waits for them. Fields:
``iteration``, ``silent_s``."""

SHADOW_DIVERGED = "shadow.diverged"
"""The shadow cannot complete an iteration (a gap not repaired in time): it diverges there and
resynchronises. Fields: ``iteration``, ``shard``, ``covered``, ``owned`` (bytes),
``last_applied``."""

SHADOW_REPLAY_FAILED = "shadow.replay_failed"
"""Replaying the optimizer step of an iteration failed. Fields: ``iteration``, ``error``."""

SHADOW_REPLAY_DIVERGED = "shadow.replay.diverged"
"""The replayer refused a step (out of order, or its input was inconsistent). Fields:
``shard``, ``iteration``, ``reason``."""

SHADOW_RESYNC = "shadow.resync"
"""A diverged shadow installed a replica's state and goes on from there. Fields: ``shard``,
``iteration``, ``previous`` (its last applied before), ``source``."""

SHADOW_RESYNC_FAILED = "shadow.resync_failed"
"""A resync from a replica failed (that replica is skipped). Fields: ``replica`` or
``source``, ``error``."""

SHADOW_CLONE_FAILED = "shadow.clone_failed"
"""A restarted (unloaded) shadow could not install the state it cloned from a replica.
Fields: ``replica``, ``error``."""

SHADOW_LOAD = "shadow.load"
"""A ``load`` installed a shard state (a bootstrap, a restore, a clone). Fields: ``shard``,
``replica``, ``iteration``, ``source``, ``generation``, ``layout`` (digest prefix),
``boxes``, ``kept_ahead`` (iterations kept in flight), ``own_state`` (a keep load)."""

SHADOW_STATE = "shadow.state"
"""The shadow's lifecycle moved (``shadow._state.NodeState``: unloaded, cloning, live,
diverged, resyncing, stopped). Fields: ``old``, ``new``, ``reason`` (what moved it: ``load``,
``clone``, ``clone_failed``, ``diverge``, ``resync``, ``resync_failed``, ``resynced``,
``stop``). A transition that keeps the state (a re-seed of a live shadow, a divergence
moving earlier) is logged at DEBUG, a change at INFO."""

SHADOW_SEEDED = "shadow.seeded"
"""A trainer re-seeded a running shadow (self-healing; the fields of :data:`SHADOW_LOAD`)."""

SHADOW_SEED_BEHIND = "shadow.seed_behind"
"""A re-seed older than what the shadow applied on its own meanwhile, not installed. Fields:
``iteration``, ``last_applied``, ``source``."""

SHADOW_SERVE_OVERRUN = "shadow.serve_overrun"
"""Fetch replies sent from the live state had not left after ``timeouts.rpc`` when the next
step had to write it (a requester that stopped reading): the step went ahead, and the
requester's checksums refuse what changed. Fields: ``replies``."""

SHADOW_SNAPSHOT = "shadow.snapshot"
"""A snapshot of the consistent iteration was written. Fields: ``iteration``, ``path``."""

SHADOW_SNAPSHOT_FAILED = "shadow.snapshot_failed"
"""Writing a snapshot failed. Fields: ``iteration``, ``error``."""

SHADOW_FINISHED = "shadow.finished"
"""Rank 0 said training ended normally (``finished`` op). Fields: ``iteration`` (the last
trained), ``generation``, ``last_applied``."""

# ------------------------------------------------------------------------------- controller

CONTROLLER_STARTED = "controller.started"
"""The controller service started. Fields: ``job``, ``bind``, ``mode``, ``switch``."""

CONTROLLER_STATE = "controller.state"
"""The controller's state machine moved. Fields: ``old``, ``new``, ``reason``."""

CONTROLLER_CONTROL_BAD_TOKEN = "controller.control_bad_token"
"""The controller refused a control request with a wrong or missing job token. Fields:
``op``."""

CONTROLLER_SHADOW_FAILED = "controller.shadow_failed"
"""A shadow stopped answering (or lost its state) past the failure timeout. Fields:
``shadow``, ``shard``, ``evidence``, ``replicas_answering``, ``degraded``."""

CONTROLLER_SHADOW_BACK = "controller.shadow_back"
"""A shadow marked failed answers again. Fields: ``shadow``, ``loaded``, ``last_applied``."""

CONTROLLER_SHADOW_REJOINED = "controller.shadow_rejoined"
"""A failed shadow caught up with its shard again. Fields: ``shadow``, ``down_s``,
``last_applied``."""

CONTROLLER_SHADOW_STOPPED = "controller.shadow_stopped"
"""A shadow went away after training finished: stopped, not failed. Fields: ``shadow``,
``after``."""

CONTROLLER_SHADOW_REFUSED_TOKEN = "controller.shadow_refused_token"
"""A shadow refused the controller's token (another job's shadow?). Fields: ``shadow``,
``error``."""

CONTROLLER_TRAINER_FAILED = "controller.trainer_failed"
"""The trainers failed (silence past the timeout, or a restart request). Fields: ``evidence``,
``silent_s``, ``switch_silent_s``, ``last_iteration``, ``ranks``, ``member``,
``requester``."""

CONTROLLER_RECOVERED = "controller.recovered"
"""Training runs again after a failure. Fields: ``istar``, ``iteration``, ``generation``,
``down_s``, ``released``."""

CONTROLLER_RESTORE_POINT = "controller.restore_point"
"""The controller fixed and published a restore point (held on its sources). Fields:
``istar``, ``fresh``, ``source``, ``usable``, ``held``."""

CONTROLLER_RESTORE_POINT_FAILED = "controller.restore_point_failed"
"""No restore point could be fixed. Fields: ``error``."""

CONTROLLER_RESTORE_POINT_STALE = "controller.restore_point_stale"
"""A trainer could not fetch the published restore point: it is fixed anew. Fields:
``istar``, ``requester``."""

CONTROLLER_HOLD_FAILED = "controller.hold_failed"
"""A hold of the restore point on one of its sources failed. Fields: ``shadow``,
``iteration``, ``attempt``, ``error``."""

CONTROLLER_HOLD_RETRY = "controller.hold_retry"
"""Not every source held the restore point: it is recomputed and held again. Fields:
``iteration``, ``attempt``, ``failed`` (shadows), ``reason``."""

CONTROLLER_RELEASE_FAILED = "controller.release_failed"
"""Releasing a hold failed. Fields: ``shadow``, ``error``."""

CONTROLLER_JOB_FINISHED = "controller.job_finished"
"""Rank 0 said training ended normally. Fields: ``iteration``, ``generation``,
``requester``."""

CONTROLLER_RELOADED = "controller.reloaded"
"""The controller took an updated job spec (SIGHUP). Fields: ``source``,
``changed_shadows``."""

CONTROLLER_SWITCH_CONVERGED = "controller.switch_converged"
"""The controller's first convergence of the switch program (its report's fields)."""

CONTROLLER_SWITCH_REPAIRED = "controller.switch_repaired"
"""A later convergence found and rewrote switch entries that differed (its report's fields)."""

CONTROLLER_CONVERGE_FAILED = "controller.converge_failed"
"""Converging the switch failed. Fields: ``error``."""

SWITCH_PIPELINE_PUSHED = "controller.switch.pipeline_pushed"
"""The switch driver pushed the P4 program (pipeline config). Fields: ``job``, ``cookie``."""

SWITCH_CONVERGED = "controller.switch.converged"
"""The switch driver wrote the entries that differed from what the job needs. Fields: ``job``,
``inserted``, ``modified``, ``deleted``, ``writes``, ``groups``, ``group_base``,
``pipeline_pushed``."""

# ------------------------------------------------------------------------------- restore, export

RESTORE_HOLD_FAILED = "restore.hold_failed"
"""``shadowgrad restore``: a hold of the restore point failed (fields of
:data:`CONTROLLER_HOLD_FAILED`)."""

RESTORE_HOLD_RETRY = "restore.hold_retry"
"""``shadowgrad restore``: the restore point is held again (fields of
:data:`CONTROLLER_HOLD_RETRY`)."""

EXPORT_DONE = "export.done"
"""An export was written. Fields: ``iteration``, ``out``, ``files``, ``bytes``, ``seconds``."""

EXPORT_RETRY = "export.retry"
"""An export attempt failed and is retried. Fields: ``iteration``, ``error``."""

EXPORT_SHADOW_ERROR = "export.shadow_error"
"""A shadow refused the export's status request (other than a bad token). Fields:
``shadow``, ``error``."""

EXPORT_SHADOW_UNREACHABLE = "export.shadow_unreachable"
"""A shadow did not answer the export. Fields: ``shadow``, ``error``."""

EXPORT_RELEASE_FAILED = "export.release_failed"
"""Releasing the export's hold failed. Fields: ``shadow``, ``iteration``, ``error``."""

EXPORT_WITHOUT_LR = "export.without_lr"
"""The exported iteration has no COMMIT record: the learning rates are not exported. Fields:
``iteration``."""

EXPORT_WITHOUT_USER_STATE = "export.without_user_state"
"""The exported iteration's user state is not exported. Fields: ``iteration``, ``reason``."""

EXPORT_LOAD_WITHOUT_MODULE_STATE = "export.load_without_module_state"
"""Loading an export into a model: the model has module state (buffers) the export does not
carry (the model keeps its own). Fields: ``names`` (the first few)."""

# ------------------------------------------------------------------------------- trainer

TRAINER_START = "trainer.start"
"""A trainer rank attached. Fields: ``generation``, ``iteration``, ``restored``,
``degraded``."""

TRAINER_RESTORE_POINT = "trainer.restore_point"
"""The restore point a restarted rank uses. Fields: ``istar``, ``source``, ``by`` (controller
or survey), ``generation``, ``shards``."""

TRAINER_RESTORE_RETRY = "trainer.restore_retry"
"""Fetching the restore point failed; another is asked for. Fields: ``istar``, ``attempt``,
``error``, ``next``."""

TRAINER_RESTORED = "trainer.restored"
"""A rank loaded the restore point. Fields: ``iteration``, ``bytes``, ``fetch_ms``,
``fetch_mb_s``."""

TRAINER_RESTORE_WITHOUT_USER_STATE = "trainer.restore_without_user_state"
"""The restore point has no COMMIT record: no user state is restored. Fields:
``iteration``."""

TRAINER_HOLD_FAILED = "trainer.hold_failed"
"""The trainers' survey (no controller): a hold failed (fields of
:data:`CONTROLLER_HOLD_FAILED`)."""

TRAINER_HOLD_RETRY = "trainer.hold_retry"
"""The trainers' survey: the restore point is held again (fields of
:data:`CONTROLLER_HOLD_RETRY`)."""

TRAINER_RELEASE_FAILED = "trainer.release_failed"
"""Releasing a hold after the restore failed. Fields: ``shadow``, ``error``."""

TRAINER_CONTROLLER_UNREACHABLE = "trainer.controller_unreachable"
"""The controller did not answer (the trainers survey the shadows instead). Fields:
``address``, ``error``."""

TRAINER_SHADOW_UNREACHABLE = "trainer.shadow_unreachable"
"""A shadow did not answer the trainers' survey. Fields: ``shadow``, ``error``."""

TRAINER_DEGRADED = "trainer.degraded"
"""The checkpoint is degraded (a shard without a usable replica). Fields: ``reason`` and
more."""

TRAINER_LOAD_FAILED = "trainer.load_failed"
"""Loading (bootstrapping) a shadow failed. Fields: ``shadow``, ``error``."""

TRAINER_KEEP_REFUSED = "trainer.keep_refused"
"""A shadow refused a keep load (it has not got the restored state): its state is sent.
Fields: ``shadow``, ``reason``."""

TRAINER_FENCED = "trainer.fenced"
"""A newer instance of the job serves the shadows: this one is fenced out. Fields:
``generation``, ``newer``."""

TRAINER_SHADOW_HEALTH = "trainer.shadow_health"
"""The health monitor's view of a shadow changed. Fields: ``shadow``, ``state``,
``previous``, ``iteration``, ``last_applied``, ``diverged_at``."""

TRAINER_RESEED = "trainer.reseed"
"""A rank re-seeded a shadow with its live state. Fields: ``shadow``, ``shard``,
``iteration`` and how it went (``bytes``, ``rtt_ms``, ...)."""

TRAINER_RESEED_FAILED = "trainer.reseed_failed"
"""A re-seed failed. Fields: ``shadow``, ``iteration``, ``error``."""

TRAINER_FINISHED_NOT_TOLD = "trainer.finished_not_told"
"""Rank 0 could not tell every shadow that training finished. Fields: ``iteration``,
``shadows``."""

TRAINER_CLOSE_UNCONFIRMED = "trainer.close_unconfirmed"
"""At close, the shadows could not confirm the last iteration. Fields: ``iteration``,
``cannot_confirm``."""

TRAINER_RING_NACK = "trainer.ring.nack"
"""The ring transport received a shadow's NACK. Fields: ``iteration``, ``ranges``."""

TRAINER_MIRROR_DEGRADED = "trainer.mirror.degraded"
"""Software (mirror) mode dropped an iteration's sends to the shadows (logged when the reason
changes; the checkpoint degrades, training does not wait). Fields: ``iteration``, ``reason``
and more."""

TRAINER_MIRROR_STREAMING = "trainer.mirror.streaming"
"""Software mode streams again. Fields: ``iteration``, ``previous``, ``dropped``."""

TRAINER_MIRROR_SUMMARY = "trainer.mirror.summary"
"""Software mode's counters at close. Fields: ``dropped``, ``dropped_total``, ``nacks``,
``nack_unavailable``, ``retx_chunks``, ``send_errors``."""

#: the events of the restore rule's holds (:func:`shadowgrad.restore.fix_restore_point`), by
#: who runs it: ``who -> (hold failed, hold retried)``
HOLD_EVENTS: dict[str, tuple[str, str]] = {
    "controller": (CONTROLLER_HOLD_FAILED, CONTROLLER_HOLD_RETRY),
    "trainer": (TRAINER_HOLD_FAILED, TRAINER_HOLD_RETRY),
    "restore": (RESTORE_HOLD_FAILED, RESTORE_HOLD_RETRY),
}


def all_names() -> dict[str, str]:
    """Every event name, by its constant's name."""
    return {k: v for k, v in globals().items() if k.isupper() and isinstance(v, str)}
