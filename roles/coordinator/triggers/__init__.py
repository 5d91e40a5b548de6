"""Event-triggered loops: a watcher the coordinator owns looks at each active trigger's workspace
and starts its work item when the event fires (``schedules.start``: single-flight, the daily cap,
signed ``trigger:NAME``), with the event's details in the goal's context.

Events, each a *fingerprint* of what the trigger watches, compared with the one it last saw
(``watch.seen`` in state.db, so a restarted org compares with what it saw before it stopped, and
many changes while it was down are one event):

- ``git-commit``: the commit a branch points at, read with libgit2 (``safegit``: nothing the
  repository configures runs);
- ``file-change``: the git blob ids of the files matching a glob (content, not timestamps; a
  file's id is recomputed only when its size or mtime changed). Polled on the watcher's tick
  rather than watchdog-driven: the same input gives the same events, and a burst of changes is
  one event once the files are quiet for ``debounce_s``;
- ``verify-fails``: every ``every_s`` the verify commands run on a copy of the current tree in
  the sandbox, through the function the eval-agent's checks run through; the state is the tree plus which
  commands failed, so one failing state fires once. A command that cannot start (exit 126/127, a
  timeout, the sandbox refusing) is not a failure: it is recorded on the trigger, nothing fires;
- ``discover``: every ``every_s`` a discovery scan (``discover.scan_all``: the verify commands'
  failures, TODO/FIXME markers, the ``issues`` file) runs on the workspace and its candidates are
  recorded as proposals (``proposals.record``, signed ``trigger:NAME``). Nothing starts unless
  org.toml's ``discover.auto_start`` names the kind and ``limits.daily_spend_usd`` has room
  (``proposals.auto_start``, with the trigger's submit options); a start is the trigger's firing,
  a cap that has no room a skip. A scan whose verify commands cannot start records why on the
  trigger and records no proposal (it would expire the open ones it cannot see).

Single-flight and coalescing as for timers: while the work a trigger started is still queued or
running, an event is skipped and counted; periods missed while the org was down are one check.

Never for the org's own changes: while a run of the org is changing the workspace (dispatched,
running, or paused mid-act) the trigger does not look, and a state equal to what the org's runs
left there — their last iteration checkpoints and approved actions' checkpoints, read from the
shadow histories — is taken as seen without firing. A commit is the org's when every file it
records is as one of those checkpoints has it (e.g. an approved ``git commit`` of the run's work).

One module per kind (``git_commit``, ``file_change``, ``verify_fails``, ``discover``), each saying
what it looks at and when a state is the org's; ``watcher`` ticks them. What a workspace holds is
asked of ``roles/operations/watch`` (files, histories, git, checks): the coordinator runs no
check and reads no history itself.
"""
from __future__ import annotations

from roles.coordinator.triggers.discover import SCANNED, discover
from roles.coordinator.triggers.seen import PASSING, Seen
from roles.coordinator.triggers.watcher import Watcher, tick
from roles.operations.watch import Observer, fingerprint

__all__ = ["PASSING", "SCANNED", "Observer", "Seen", "Watcher", "discover", "fingerprint", "tick"]
