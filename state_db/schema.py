"""The named migrations, in order. Each is applied in one transaction; never edit an applied one.

Append a new ``(name, sql)`` pair to change the schema; ``PRAGMA user_version`` counts them.
"""
from __future__ import annotations

INITIAL = """
CREATE TABLE org_session (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    status TEXT NOT NULL,
    started_at REAL, updated_at REAL NOT NULL,
    supervisor_pid INTEGER, supervisor_start TEXT,
    detail TEXT
);
CREATE TABLE role_instances (
    instance TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    status TEXT NOT NULL,
    pid INTEGER, pid_start TEXT,
    endpoint TEXT,
    heartbeat_at REAL, started_at REAL, updated_at REAL NOT NULL,
    restarts INTEGER NOT NULL DEFAULT 0,
    last_exit TEXT,
    current_work TEXT
);
CREATE TABLE work_items (
    id TEXT PRIMARY KEY,
    goal TEXT NOT NULL,
    workspace TEXT NOT NULL,
    verify TEXT NOT NULL DEFAULT '[]',
    protect TEXT NOT NULL DEFAULT '[]',
    caps TEXT NOT NULL DEFAULT '{}',
    backend TEXT NOT NULL,
    status TEXT NOT NULL,
    stop_reason TEXT, stop_detail TEXT,
    assigned_to TEXT,
    attempt INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    worktree INTEGER NOT NULL DEFAULT 0, branch TEXT,
    elapsed_s REAL NOT NULL DEFAULT 0,
    created_by TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    ended_at REAL,
    CHECK ((status = 'ended') = (stop_reason IS NOT NULL))
);
CREATE INDEX work_items_status ON work_items(status);
CREATE TABLE attempts (
    work_id TEXT NOT NULL REFERENCES work_items(id),
    attempt INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    instance TEXT,
    started_at REAL NOT NULL, ended_at REAL,
    outcome TEXT,
    PRIMARY KEY (work_id, attempt)
);
CREATE TABLE iterations (
    work_id TEXT NOT NULL REFERENCES work_items(id),
    n INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    act_status TEXT NOT NULL,
    act_summary TEXT NOT NULL DEFAULT '',
    tool_calls TEXT NOT NULL DEFAULT '[]',
    input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0, cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    elapsed_s REAL NOT NULL DEFAULT 0,
    fingerprint TEXT, checkpoint TEXT,
    changed_paths TEXT NOT NULL DEFAULT '[]',
    verdict_id TEXT, feedback TEXT, lesson TEXT,
    prompt TEXT NOT NULL DEFAULT '{}',
    committed_at REAL NOT NULL,
    PRIMARY KEY (work_id, n)
);
CREATE TABLE model_calls (
    request_id TEXT PRIMARY KEY,
    work_id TEXT, iteration INTEGER, attempt INTEGER, instance TEXT,
    model TEXT NOT NULL,
    input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0, cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    at REAL NOT NULL
);
CREATE INDEX model_calls_work ON model_calls(work_id);
CREATE TABLE verdicts (
    id TEXT PRIMARY KEY,
    work_id TEXT NOT NULL REFERENCES work_items(id),
    iteration INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    checks TEXT NOT NULL DEFAULT '[]',
    feedback TEXT NOT NULL DEFAULT '',
    protected_changed TEXT NOT NULL DEFAULT '[]',
    written_by TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX verdicts_work ON verdicts(work_id, iteration);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    actor TEXT NOT NULL, instance TEXT, os_user TEXT,
    kind TEXT NOT NULL,
    subject TEXT,
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_kind ON events(kind);
CREATE TABLE delivery_ledger (
    msg_id TEXT PRIMARY KEY,
    recipient TEXT NOT NULL,
    sender TEXT, kind TEXT,
    created_at REAL,
    recorded_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX delivery_ledger_age ON delivery_ledger(recorded_at);
CREATE TABLE transport_counters (
    instance TEXT NOT NULL,
    name TEXT NOT NULL,
    value INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (instance, name)
) WITHOUT ROWID;
CREATE TABLE idempotency (
    key TEXT PRIMARY KEY,
    actor TEXT NOT NULL, os_user TEXT,
    command TEXT NOT NULL,
    result TEXT NOT NULL DEFAULT '{}',
    at REAL NOT NULL
);
CREATE TABLE decisions (
    id TEXT PRIMARY KEY,
    work_id TEXT NOT NULL REFERENCES work_items(id),
    iteration INTEGER,
    kind TEXT NOT NULL,
    action TEXT NOT NULL DEFAULT '{}',
    question TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL,
    answer TEXT,
    stop_run INTEGER NOT NULL DEFAULT 0,
    result TEXT,
    decided_by TEXT, decided_at REAL,
    created_at REAL NOT NULL, announced_at REAL
);
CREATE TABLE raw_notes (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    fact TEXT NOT NULL, judgment TEXT NOT NULL, rationale TEXT NOT NULL, applicability TEXT NOT NULL,
    evidence TEXT NOT NULL DEFAULT '{}',
    status TEXT NOT NULL,
    curated_id TEXT,
    created_at REAL NOT NULL
);
CREATE TABLE curated_notes (
    id TEXT PRIMARY KEY,
    topic TEXT NOT NULL,
    body TEXT NOT NULL,
    source_notes TEXT NOT NULL DEFAULT '[]',
    contradicts TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL, updated_at REAL NOT NULL
);
CREATE TABLE candidate_batches (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    created_at REAL NOT NULL, announced_at REAL, closed_at REAL
);
CREATE TABLE skill_candidates (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    body TEXT NOT NULL DEFAULT '',
    score INTEGER NOT NULL DEFAULT 0,
    signals TEXT NOT NULL DEFAULT '{}',
    source_notes TEXT NOT NULL DEFAULT '[]',
    status TEXT NOT NULL,
    merged_into TEXT,
    batch_id TEXT REFERENCES candidate_batches(id),
    decided_by TEXT, decided_at REAL,
    created_at REAL NOT NULL
);
CREATE TABLE skills (
    name TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    candidate_id TEXT,
    origin TEXT NOT NULL DEFAULT '{}',
    status TEXT NOT NULL,
    use_count INTEGER NOT NULL DEFAULT 0,
    last_used_at REAL,
    created_at REAL NOT NULL
);
CREATE TABLE usage_summaries (
    work_id TEXT PRIMARY KEY,
    calls INTEGER NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    cache_write_tokens INTEGER NOT NULL, cache_read_tokens INTEGER NOT NULL, cost_usd REAL NOT NULL,
    pruned_at REAL NOT NULL
);
CREATE TABLE workspace_locks (
    workspace TEXT PRIMARY KEY,
    work_id TEXT NOT NULL REFERENCES work_items(id),
    acquired_at REAL NOT NULL
);
"""

# The knowledge pipeline: a curated note remembers its kind and how its pattern scored
# (tier: curated | queued | recommended), and the curator's queries get their indexes.
KNOWLEDGE = """
ALTER TABLE curated_notes ADD COLUMN kind TEXT NOT NULL DEFAULT '';
ALTER TABLE curated_notes ADD COLUMN tier TEXT NOT NULL DEFAULT 'curated';
ALTER TABLE curated_notes ADD COLUMN score INTEGER;
ALTER TABLE curated_notes ADD COLUMN signals TEXT NOT NULL DEFAULT '{}';
CREATE INDEX raw_notes_status ON raw_notes(status);
CREATE INDEX raw_notes_run ON raw_notes(run_id);
CREATE INDEX raw_notes_curated ON raw_notes(curated_id);
CREATE INDEX skill_candidates_status ON skill_candidates(status);
CREATE INDEX skill_candidates_name ON skill_candidates(name);
"""

# Verify commands are run once on the baseline before the first act (the preflight); a verdict
# says what was held back from verification; --no-default-protect is remembered per work item.
VERIFIER = """
CREATE TABLE preflights (
    work_id TEXT PRIMARY KEY REFERENCES work_items(id),
    outcome TEXT NOT NULL,
    checks TEXT NOT NULL DEFAULT '[]',
    detail TEXT NOT NULL DEFAULT '',
    written_by TEXT NOT NULL,
    at REAL NOT NULL
);
ALTER TABLE verdicts ADD COLUMN held_back TEXT NOT NULL DEFAULT '[]';
ALTER TABLE verdicts ADD COLUMN evidence TEXT NOT NULL DEFAULT '';
ALTER TABLE work_items ADD COLUMN default_protect INTEGER NOT NULL DEFAULT 1;
"""

# The submitter's toolchain (PATH, HOME, paths the work item names): what the sandbox shows
# its commands (roles/workbench/sandbox/toolchains.py).
SANDBOX_PATH = """
ALTER TABLE work_items ADD COLUMN toolchain TEXT NOT NULL DEFAULT '{}';
"""

# Waiting is a state the org reconciles: the process that runs an approved action (so only a
# dead one's marker becomes a question again), the checkpoint taken after it, an attempt's last
# sign of life (a killed attempt's time still counts), the time spent in discarded attempts, and
# one pending decision per run and action (duplicates of a still-pending one are dropped first).
WAITING = """
ALTER TABLE decisions ADD COLUMN executor TEXT;
ALTER TABLE decisions ADD COLUMN checkpoint TEXT;
ALTER TABLE attempts ADD COLUMN alive_at REAL;
ALTER TABLE work_items ADD COLUMN discarded_s REAL NOT NULL DEFAULT 0;
DELETE FROM decisions WHERE status = 'pending' AND rowid NOT IN (
    SELECT MIN(rowid) FROM decisions WHERE status = 'pending'
     GROUP BY work_id, kind, json_extract(action, '$.command'));
CREATE UNIQUE INDEX decisions_one_pending ON decisions(work_id, kind, json_extract(action, '$.command'))
    WHERE status = 'pending';
"""

# The database refuses what the vocabulary forbids (triggers generated from vocab.py, kept in
# step with it at every migrate: state_db/vocab_guard.py), and 'org continue' keeps each ending
# of a run it reopens: its reason, its caps, the iterations committed by then, who continued it
# and with which caps.
STOP_HISTORY = """
CREATE TABLE stop_history (
    work_id TEXT NOT NULL REFERENCES work_items(id),
    seq INTEGER NOT NULL,
    stop_reason TEXT NOT NULL,
    stop_detail TEXT,
    ended_at REAL,
    iterations INTEGER NOT NULL,
    caps TEXT NOT NULL DEFAULT '{}',
    new_caps TEXT NOT NULL DEFAULT '{}',
    continued_by TEXT NOT NULL,
    continued_at REAL NOT NULL,
    PRIMARY KEY (work_id, seq)
);
"""


# What a run is doing right now, for `org status` and `org watch`: the tool call an open attempt
# is running (written when a tool starts, cleared when it ends; bookkeeping, not journaled).
STATUS = """
ALTER TABLE attempts ADD COLUMN current_tool TEXT;
ALTER TABLE attempts ADD COLUMN current_tool_at REAL;
"""


def _vocabulary(conn) -> None:
    from state_db.vocab_guard import install
    conn.execute(STOP_HISTORY)
    install(conn)


# Attention: what the coordinator told a human outside the chat (a desktop notification, a
# webhook POST), one row per attention event, written with the announcement that covers it, so a
# restarted coordinator neither repeats nor drops a delivery.
ATTENTION = """
CREATE TABLE attention (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    subject TEXT,
    text TEXT NOT NULL,
    link TEXT,
    created_at REAL NOT NULL,
    notified_at REAL,
    posted_at REAL,
    post_attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT
);
CREATE INDEX attention_undelivered ON attention(created_at) WHERE posted_at IS NULL;
"""


# Discovery: work candidates a read-only scan found (failing checks, FIXME/TODO markers, an issue
# list), each with its evidence and a suggested goal, verify commands and caps. Nothing starts
# until a human (or a standing policy within the daily spend cap) accepts one; a stable
# fingerprint keeps a re-run of the scan from proposing the same open candidate twice.
PROPOSALS = """
CREATE TABLE proposals (
    id TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    workspace TEXT NOT NULL,
    kind TEXT NOT NULL,
    source TEXT NOT NULL,
    title TEXT NOT NULL,
    goal TEXT NOT NULL,
    verify TEXT NOT NULL DEFAULT '[]',
    caps TEXT NOT NULL DEFAULT '{}',
    evidence TEXT NOT NULL DEFAULT '{}',
    rank INTEGER NOT NULL,
    recommended INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at REAL NOT NULL,
    seen_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    decided_by TEXT, decided_at REAL, detail TEXT,
    work_id TEXT REFERENCES work_items(id) DEFERRABLE INITIALLY DEFERRED   -- set with the item's insert
);
CREATE UNIQUE INDEX proposals_one_open ON proposals(workspace, fingerprint) WHERE status = 'proposed';
CREATE INDEX proposals_status ON proposals(status, workspace);
"""

# Standing orders: schedules (a timer) and triggers (an event on a workspace) that submit work
# items as the coordinator, signed ``schedule:NAME`` / ``trigger:NAME``. Next-due times come from
# these rows (the last tick handled + the rule), never from an in-memory timer; ``watch`` keeps
# what a trigger last saw. A work item records what started it (origin, and the order's id).
SCHEDULES = """
CREATE TABLE schedules (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    rule TEXT NOT NULL DEFAULT '{}',
    request TEXT NOT NULL DEFAULT '{}',
    argv TEXT NOT NULL DEFAULT '[]',
    status TEXT NOT NULL,
    created_by TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    last_tick_at REAL,
    last_fired_at REAL,
    last_work_id TEXT,
    fired INTEGER NOT NULL DEFAULT 0,
    skipped_busy INTEGER NOT NULL DEFAULT 0,
    skipped_spend INTEGER NOT NULL DEFAULT 0,
    coalesced INTEGER NOT NULL DEFAULT 0,
    last_skip TEXT,
    watch TEXT NOT NULL DEFAULT '{}'
);
CREATE UNIQUE INDEX schedules_live_name ON schedules(name) WHERE status != 'removed';
ALTER TABLE work_items ADD COLUMN origin TEXT NOT NULL DEFAULT 'human';
ALTER TABLE work_items ADD COLUMN origin_id TEXT;
CREATE INDEX work_items_origin ON work_items(origin_id) WHERE origin_id IS NOT NULL;
"""




# The eval-agent's review (roles/eval_agent/review.py): a work item's review criteria (from
# --review or org.toml, fixed at submit), and on each verdict the review that judged it (its
# answer, reasons and model; NULL when none ran). Review usage is model_calls rows of the eval-agent.
REVIEW = """
ALTER TABLE work_items ADD COLUMN review TEXT NOT NULL DEFAULT '{}';
ALTER TABLE verdicts ADD COLUMN review TEXT;
"""


# The wrap-up (roles/loop_agent/wrapup.py): when a token, cost or time budget trips, one bounded
# act with no tools that write leaves a hand-off note — what was done, what remains, what was
# learned — one per ending of the run (``ending``: 1 for the first, then one more per 'org
# continue'); an attempt row marks its act (``wrapup``) so a crash never buys a second one. A
# run's next step (roles/loop_agent/steps.py) is kept on the work item while it is paused or parked.
HANDOFF = """
CREATE TABLE handoffs (
    work_id TEXT NOT NULL REFERENCES work_items(id),
    ending INTEGER NOT NULL,
    done TEXT NOT NULL,
    remains TEXT NOT NULL,
    learned TEXT NOT NULL,
    note TEXT NOT NULL DEFAULT '',
    source TEXT NOT NULL CHECK (source IN ('wrapup', 'record')),
    allowance TEXT NOT NULL DEFAULT '{}',
    attempt INTEGER,
    tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    elapsed_s REAL NOT NULL DEFAULT 0,
    written_by TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (work_id, ending)
);
ALTER TABLE attempts ADD COLUMN wrapup INTEGER NOT NULL DEFAULT 0;
ALTER TABLE work_items ADD COLUMN next_step TEXT;
"""

# Roles on other hosts (org join): every instance an org reaches over tcp — the coordinator
# host's and each joined host's — with where it listens, its CURVE public key and the HMAC key
# its envelopes are signed with. A host's supervisor writes its own instances' rows; every role
# reads them to reach and authenticate the others (transport/peers.py). ``git_url``: where a
# joined host fetches and pushes work items' histories (the coordinator host's row only).
PEERS = """
CREATE TABLE peers (
    instance TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    role TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    curve_public TEXT NOT NULL CHECK (length(curve_public) = 40),
    hmac_key TEXT NOT NULL CHECK (length(hmac_key) = 64),
    git_url TEXT NOT NULL DEFAULT '',
    registered_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE UNIQUE INDEX peers_one_key ON peers(curve_public);
"""

# Skill replays (skills/replay.py): a candidate (or a skill) proves its value before a human
# reviews it. Each replay is an ordinary work item (origin 'replay') run from the baseline of an
# ended item, once with the skill in context and once without; ``replays`` says which arm it is
# and freezes the text the 'with' arm carries. ``replay_plans`` records, per subject, what the
# coordinator planned (the items chosen, or why none) so a batch waits for measured candidates.
REPLAYS = """
CREATE TABLE replays (
    work_id TEXT PRIMARY KEY REFERENCES work_items(id),
    subject TEXT NOT NULL,
    subject_kind TEXT NOT NULL,
    source_id TEXT NOT NULL,
    relation TEXT NOT NULL,
    arm TEXT NOT NULL,
    skill_name TEXT NOT NULL,
    skill_text TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX replays_subject ON replays(subject);
CREATE TABLE replay_plans (
    subject TEXT PRIMARY KEY,
    subject_kind TEXT NOT NULL,
    status TEXT NOT NULL,
    name TEXT NOT NULL,
    skill_text TEXT NOT NULL,
    items TEXT NOT NULL DEFAULT '[]',
    reason TEXT NOT NULL DEFAULT '',
    planned_by TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""

# Why a human decided a skill candidate as they did (``org candidates reject ID --reason TEXT``),
# as ``org decide`` keeps a rejection's reason; and who took an ended run out of "needs you"
# (``org dismiss ID``) and when: the run and its stop reason stay as they were.
ROUGH_EDGES = """
ALTER TABLE skill_candidates ADD COLUMN decided_reason TEXT;
ALTER TABLE work_items ADD COLUMN dismissed_by TEXT;
ALTER TABLE work_items ADD COLUMN dismissed_at REAL;
"""


# How an attempt closed is a vocabulary (state_db.vocab.AttemptOutcome), its code a column of its
# own: rows written as "kind:code" before are split.
CONTRACT = """
ALTER TABLE attempts ADD COLUMN detail TEXT;
UPDATE attempts SET detail = outcome, outcome = 'interrupted' WHERE outcome IN ('interrupted', 'cancelled', 'org_limit');
UPDATE attempts SET detail = substr(outcome, 13), outcome = 'model_error' WHERE outcome LIKE 'model_error:%';
UPDATE attempts SET outcome = 'wrapped_up' WHERE outcome = 'wrapup:ok';
UPDATE attempts SET detail = substr(outcome, 8), outcome = 'wrapup_failed' WHERE outcome LIKE 'wrapup:%';
UPDATE curated_notes SET kind = 'context' WHERE kind NOT IN ('outcome', 'failure', 'fix', 'context');
ALTER TABLE handoffs ADD COLUMN act TEXT;
"""

# A run's model ladder (state_db.queries.work.Ladder: the models, the rung it is on, since when and
# why) and the model each iteration acted on.
LADDER = """
ALTER TABLE work_items ADD COLUMN ladder TEXT NOT NULL DEFAULT '{}';
ALTER TABLE iterations ADD COLUMN model TEXT;
"""


# The change scope (roles/eval_agent/scope.py): the globs that widen a work item's scope (--scope
# at submit, and each widening a human approved during the run), and on each verdict the commit
# of the tree its checks ran on; at goal_met the workspace is made to hold that tree, and
# ``delivered`` says how that went (roles/workbench/workspace/delivered.py: the commit, the changes kept
# apart, and whether the content comparison proved it; NULL until then).
SCOPE = """
ALTER TABLE work_items ADD COLUMN scope TEXT NOT NULL DEFAULT '[]';
ALTER TABLE work_items ADD COLUMN delivered TEXT;
ALTER TABLE verdicts ADD COLUMN verified TEXT;
"""


# Held-out checks (roles/workbench/sandbox/held_out.py): the folder a work item's verifications copy into
# each snapshot (``--verify-hidden``, ``[verify] hidden``); '' for none.
EVIDENCE = """
ALTER TABLE work_items ADD COLUMN verify_hidden TEXT NOT NULL DEFAULT '';
"""


# An idempotency key is bound to its command's arguments: ``args`` is the digest of the command
# and its arguments (state_db.writer.args_digest); a key reused with others is a conflict. Rows
# written before have none and are matched on the command alone.
DOORS = """
ALTER TABLE idempotency ADD COLUMN args TEXT;
"""


# The transcript of every act (roles/loop_agent/transcript.py): the model's turns, each tool call
# with its input and result, the act's prompt and outcome, in order (``seq`` per attempt).
# Written by the loop-agent with the usage of each model response and with the attempt's close;
# a discarded attempt keeps its entries (its attempts row says it was discarded). Bounded per
# run; retention deletes the entries of runs ended longer ago than ``retention.transcript_days``.
TRANSCRIPT = """
CREATE TABLE transcript (
    work_id TEXT NOT NULL REFERENCES work_items(id),
    attempt INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    kind TEXT NOT NULL,
    at REAL NOT NULL,
    data TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (work_id, attempt, seq)
);
"""

# What an org reads per iteration must not grow with the work it has ended: the live items are
# found through a partial index, a workspace's items and an instance's attempts through their
# own, and the org's usage (its spend: the org-wide cap, read before every model call) is
# kept as a running total that triggers update with every row of usage, so no reader sums the history.
HISTORY = """
DROP INDEX work_items_status;
CREATE INDEX work_items_status ON work_items(status, created_at);
CREATE INDEX work_items_live ON work_items(created_at) WHERE status != 'ended';
CREATE INDEX work_items_workspace ON work_items(workspace, created_at);
CREATE INDEX work_items_ended ON work_items(ended_at) WHERE status = 'ended';
CREATE INDEX attempts_instance ON attempts(instance, started_at);
CREATE TABLE usage_total (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    calls INTEGER NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    cache_write_tokens INTEGER NOT NULL, cache_read_tokens INTEGER NOT NULL, cost_usd REAL NOT NULL
);
INSERT INTO usage_total (id, calls, input_tokens, output_tokens, cache_write_tokens, cache_read_tokens, cost_usd)
    SELECT 1, (SELECT COUNT(*) FROM model_calls) + (SELECT COALESCE(SUM(calls), 0) FROM usage_summaries),
    (SELECT COALESCE(SUM(input_tokens), 0) FROM model_calls) + (SELECT COALESCE(SUM(input_tokens), 0) FROM usage_summaries),
    (SELECT COALESCE(SUM(output_tokens), 0) FROM model_calls) + (SELECT COALESCE(SUM(output_tokens), 0) FROM usage_summaries),
    (SELECT COALESCE(SUM(cache_write_tokens), 0) FROM model_calls) + (SELECT COALESCE(SUM(cache_write_tokens), 0) FROM usage_summaries),
    (SELECT COALESCE(SUM(cache_read_tokens), 0) FROM model_calls) + (SELECT COALESCE(SUM(cache_read_tokens), 0) FROM usage_summaries),
    (SELECT COALESCE(SUM(cost_usd), 0) FROM model_calls) + (SELECT COALESCE(SUM(cost_usd), 0) FROM usage_summaries);
CREATE TRIGGER usage_calls_added AFTER INSERT ON model_calls
BEGIN UPDATE usage_total SET calls = calls + 1, input_tokens = input_tokens + NEW.input_tokens, output_tokens = output_tokens + NEW.output_tokens, cache_write_tokens = cache_write_tokens + NEW.cache_write_tokens, cache_read_tokens = cache_read_tokens + NEW.cache_read_tokens, cost_usd = cost_usd + NEW.cost_usd WHERE id = 1; END;
CREATE TRIGGER usage_calls_removed AFTER DELETE ON model_calls
BEGIN UPDATE usage_total SET calls = calls - 1, input_tokens = input_tokens - OLD.input_tokens, output_tokens = output_tokens - OLD.output_tokens, cache_write_tokens = cache_write_tokens - OLD.cache_write_tokens, cache_read_tokens = cache_read_tokens - OLD.cache_read_tokens, cost_usd = cost_usd - OLD.cost_usd WHERE id = 1; END;
CREATE TRIGGER usage_calls_changed AFTER UPDATE ON model_calls
BEGIN UPDATE usage_total SET input_tokens = input_tokens - OLD.input_tokens + NEW.input_tokens, output_tokens = output_tokens - OLD.output_tokens + NEW.output_tokens, cache_write_tokens = cache_write_tokens - OLD.cache_write_tokens + NEW.cache_write_tokens, cache_read_tokens = cache_read_tokens - OLD.cache_read_tokens + NEW.cache_read_tokens, cost_usd = cost_usd - OLD.cost_usd + NEW.cost_usd WHERE id = 1; END;
CREATE TRIGGER usage_summaries_added AFTER INSERT ON usage_summaries
BEGIN UPDATE usage_total SET calls = calls + NEW.calls, input_tokens = input_tokens + NEW.input_tokens, output_tokens = output_tokens + NEW.output_tokens, cache_write_tokens = cache_write_tokens + NEW.cache_write_tokens, cache_read_tokens = cache_read_tokens + NEW.cache_read_tokens, cost_usd = cost_usd + NEW.cost_usd WHERE id = 1; END;
CREATE TRIGGER usage_summaries_removed AFTER DELETE ON usage_summaries
BEGIN UPDATE usage_total SET calls = calls - OLD.calls, input_tokens = input_tokens - OLD.input_tokens, output_tokens = output_tokens - OLD.output_tokens, cache_write_tokens = cache_write_tokens - OLD.cache_write_tokens, cache_read_tokens = cache_read_tokens - OLD.cache_read_tokens, cost_usd = cost_usd - OLD.cost_usd WHERE id = 1; END;
CREATE TRIGGER usage_summaries_changed AFTER UPDATE ON usage_summaries
BEGIN UPDATE usage_total SET calls = calls - OLD.calls + NEW.calls, input_tokens = input_tokens - OLD.input_tokens + NEW.input_tokens, output_tokens = output_tokens - OLD.output_tokens + NEW.output_tokens, cache_write_tokens = cache_write_tokens - OLD.cache_write_tokens + NEW.cache_write_tokens, cache_read_tokens = cache_read_tokens - OLD.cache_read_tokens + NEW.cache_read_tokens, cost_usd = cost_usd - OLD.cost_usd + NEW.cost_usd WHERE id = 1; END;
"""


MIGRATIONS: list[tuple[str, str]] = [
    ("0001_initial", INITIAL),
    ("0002_knowledge", KNOWLEDGE),
    ("0003_verifier", VERIFIER),
    ("0004_sandbox_path", SANDBOX_PATH),
    ("0005_waiting", WAITING),
    ("0006_vocabulary", _vocabulary),
    ("0008_status", STATUS),
    ("0009_attention", ATTENTION),
    ("0010_schedules", SCHEDULES),
    ("0011_proposals", PROPOSALS),
    ("0012_review", REVIEW),
    ("0013_handoff", HANDOFF),
    ("0014_peers", PEERS),
    ("0015_scope", SCOPE),
    ("0016_transcript", TRANSCRIPT),
    ("0017_rough_edges", ROUGH_EDGES),
    ("0018_contract", CONTRACT),
    ("0018_ladder", LADDER),
    ("0020_doors", DOORS),
    ("0021_evidence", EVIDENCE),
    ("0022_replays", REPLAYS),
    ("0023_history", HISTORY),
]
