"""What a retro finds in a run's record: each finding is a stated predicate, computed without a model.

- **verifiable** — the work item has at least one verify command and, if any verdict exists,
  at least one check *ran to completion* in some verdict (not timed out, exit code known and
  not 126/127 "cannot run / not found").
- **stop reason fits** — per reason: ``goal_met`` the last iteration passed; ``repeated_failure``
  the last two verdicts fail the same checks with the same signatures; ``no_progress`` two
  iterations share a fingerprint; ``max_iterations`` the cap was reached and the run was *not*
  converging (the last verdict fails no fewer checks than the first); ``token_budget`` /
  ``cost_budget`` / ``timeout`` the usage reached the cap; ``cancelled``, ``human_rejected``,
  ``model_error``, ``org_limit`` always fit (a human's or the machine's own decision).
- **repeated failure** — a check that failed in ≥ 2 verified iterations.
- **carried / used / helped** for each skill or knowledge id in the prompt manifests:
  carried ⇔ the id is in some iteration's manifest; *used* ⇔ carried and (an act summary or
  tool call of an iteration that carried it mentions one of its trigger terms, or the run
  reached ``goal_met``); *helped* ⇔ used and the run reached ``goal_met``.
- **lesson heeded** — the lesson written after iteration n was heeded if iteration n+1 was
  verified and fails none of the (check, signature) pairs iteration n failed.
- **budget** — usage against each cap that was set; ≥ 80 % counts as *near*.
- **environment failure** — a failing check the verifier could not run (it carries a ``code``),
  that could not start (exit 126/127), or whose output says a command or module is missing
  (``command not found``, ``: not found``, ``No module named``): the machine failed, not the
  doer. Such checks are never the subject of a note, and a run that failed only that way (it did
  not reach ``goal_met``) teaches nothing (``taught_nothing``).
- **why** (``failure_why``) — what a failing check says went wrong, the same from run to run: the
  failing test ids (as the eval-agent recorded them in the check) with the kinds of error raised,
  else the salient line with runner summaries, timings, paths and numbers left out — never
  ``1 failed, 2 passed in 0.06s``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from knowledge.record import Check, Iteration, RunRecord

CANNOT_RUN = (126, 127)
NEAR = 0.8
CHECK_CHARS = 60
_SALIENT = re.compile(r"(error|fail|assert|exception|traceback|expected|panic|timed out|エラー|失敗)",
                      re.IGNORECASE)
# the sandbox runs checks without a network: a name lookup or connection that failed is the
# sandbox's doing, not the work's (uv or npm fetching a package, a test reaching a server)
_MISSING = re.compile(r"command not found|: not found\b|No module named|failed to lookup address|"
                      r"Temporary failure in name resolution|Name or service not known|Could not resolve host|"
                      r"getaddrinfo (?:EAI_AGAIN|ENOTFOUND)|Network is unreachable", re.IGNORECASE)
_ERROR_KIND = re.compile(r"\b([A-Z]\w*(?:Error|Exception))\b")
# runner summaries ("1 failed, 2 passed in 0.06s", "Ran 3 tests in 0.001s", "FAILED (failures=1)"):
# counts and timings, never what went wrong
_SUMMARY = re.compile(r"^=*\s*(?:\d+ \w+,? )*(?:\d+ \w+|no tests ran) in [\d.]+\s*s|^Ran \d+ tests? in "
                      r"|^(?:OK|FAILED) \(|^(?:Tests|Test Suites):|^test result:|^# (?:tests|pass|fail) ")
_NOISE = [(re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
          (re.compile(r"\b\d+(?:\.\d+)?\s*(?:s|ms|us|µs|sec|seconds)\b"), ""),
          (re.compile(r"(?:/[\w.@+-]+)+/([\w.@+-]+)"), r"\1"),
          (re.compile(r"\b\d+(?:\.\d+)?\b"), "N")]
MAX_IDS = 3


def clip(text: str, n: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= n else flat[: max(0, n - 1)].rstrip() + "…"


def short_check(check: str, max_chars: int = CHECK_CHARS) -> str:
    """A check command as people read it: the program's base name, the middle cut if long."""
    flat = " ".join(check.split())
    head, _, rest = flat.partition(" ")
    if "/" in head:
        flat = head.rsplit("/", 1)[-1] + (" " + rest if rest else "")
    if len(flat) <= max_chars:
        return flat
    keep = (max_chars - 1) // 2
    return flat[:keep].rstrip() + "…" + flat[-keep:].lstrip()


def environment_failure(check: Check) -> str | None:
    """Why a failing check is the environment's or the verifier's failure, not the doer's (None:
    it is the work's). See the module docstring."""
    if check.passed:
        return None
    if check.code:
        return f"the verifier could not run it ({check.code})"
    if check.exit_code in CANNOT_RUN:
        return f"the command could not start (exit {check.exit_code})"
    m = _MISSING.search(check.output_tail)
    return f"the environment lacks something: {clip(m.group(0), 40)}" if m else None


def taught_nothing(rec: RunRecord) -> str | None:
    """Why the run's record holds no lesson about the work (None: it holds some): it did not
    reach goal_met and every check that failed in it failed because of the environment."""
    failing = [c for it in rec.iterations for c in it.failing]
    if rec.goal_met or not failing:
        return None
    reasons = [environment_failure(c) for c in failing]
    return reasons[-1] if all(reasons) else None


def test_ids(check: Check) -> list[str]:
    """The ids of the tests ``check`` failed, as the eval-agent recorded them (``failing_tests``).
    A record written before the eval-agent recorded them names none: the retro then says why from
    the output's salient line (``failure_why``); the judge's parser is never run here."""
    return list(check.tests)


def failure_why(check: Check) -> str:
    """What went wrong in ``check``, in words that do not change from run to run (module docstring)."""
    kinds = sorted(set(_ERROR_KIND.findall(check.output_tail)))
    ids = test_ids(check)
    if ids:
        shown = ", ".join(ids[:MAX_IDS]) + (f" and {len(ids) - MAX_IDS} more" if len(ids) > MAX_IDS else "")
        return clip(f"{shown} fail" + (f" ({', '.join(kinds[:2])})" if kinds else ""), 160)
    lines = [ln.strip() for ln in check.output_tail.splitlines() if ln.strip() and not _SUMMARY.search(ln.strip())]
    hits = [ln for ln in lines if _SALIENT.search(ln)]
    line = (hits or lines or [f"exit {check.exit_code}" if not check.timed_out else "timed out"])[-1]
    for pattern, repl in _NOISE:
        line = pattern.sub(repl, line)
    return clip(" ".join(line.split()).strip(" :,-=") or "no output", 120)


def span(ns: Sequence[int]) -> str:
    return ", ".join(str(n) for n in ns)


@dataclass(frozen=True)
class Finding:
    ok: bool
    why: str


def verifiability(rec: RunRecord) -> Finding:
    if not rec.verify:
        return Finding(False, "the work item has no verify command")
    verified = [it for it in rec.iterations if it.outcome is not None]
    if not verified:
        return Finding(True, f"{len(rec.verify)} verify command(s), never run (no iteration was verified)")
    ran = [c for it in verified for c in it.checks
           if not c.timed_out and c.exit_code is not None and c.exit_code not in CANNOT_RUN]
    if not ran:
        return Finding(False, "no check ever ran to completion (every run timed out or could not start)")
    protected = sorted({p for it in verified for p in it.protected_changed})
    extra = f"; protected files were changed and restored: {', '.join(protected[:3])}" if protected else ""
    return Finding(True, f"{len(rec.verify)} verify command(s) ran to completion in {len(verified)} verdict(s){extra}")


def _failing_pairs(it: Iteration) -> frozenset[tuple[str, str]]:
    return frozenset((c.name, c.signature) for c in it.failing)


def stop_fit(rec: RunRecord) -> Finding:
    reason, its, caps = rec.stop_reason, rec.iterations, rec.caps
    verified = [it for it in its if it.outcome is not None]
    if reason == "goal_met":
        ok = bool(verified) and verified[-1].passed
        return Finding(ok, f"iteration {verified[-1].n} passed every check" if ok else "the last verdict did not pass")
    if reason == "repeated_failure":
        if len(verified) >= 2 and _failing_pairs(verified[-1]) and \
                _failing_pairs(verified[-1]) == _failing_pairs(verified[-2]):
            names = sorted({c for c, _ in _failing_pairs(verified[-1])})
            return Finding(True, f"iterations {verified[-2].n} and {verified[-1].n} failed "
                                 f"{', '.join(f'`{short_check(n)}`' for n in names)} with the same signature")
        return Finding(False, "the last two verdicts did not fail the same way")
    if reason == "no_progress":
        seen: dict[str, int] = {}
        for it in its:
            if it.fingerprint and it.fingerprint in seen:
                return Finding(True, f"iterations {seen[it.fingerprint]} and {it.n} ended in the same state")
            seen.setdefault(it.fingerprint, it.n)
        return Finding(False, "no two iterations ended in the same state")
    if reason == "max_iterations":
        cap = caps.get("max_iterations")
        if cap is None or len(its) < cap:
            return Finding(False, f"{len(its)} iteration(s) against a cap of {cap}")
        if len(verified) >= 2 and len(verified[-1].failing) < len(verified[0].failing):
            return Finding(False, f"the run was converging ({len(verified[0].failing)} → "
                                  f"{len(verified[-1].failing)} failing checks) when the cap of {cap} cut it")
        return Finding(True, f"{cap} iterations without converging")
    limits = {"token_budget": ("budget_tokens", rec.tokens, "tokens"),
              "cost_budget": ("budget_usd", rec.cost_usd, "USD"),
              "timeout": ("timeout_s", rec.elapsed_s, "seconds")}
    if reason in limits:
        key, used, unit = limits[reason]
        cap = caps.get(key)
        if cap is None:
            return Finding(False, f"no {key} cap was set")
        return Finding(used >= cap * 0.999, f"{used:g} of {cap:g} {unit} used")
    human = {"cancelled": "a human cancelled the run", "human_rejected": "a human rejected a gated action",
             "model_error": f"the model backend failed ({clip(rec.stop_detail, 80) or 'no detail'})",
             "org_limit": "the org-wide spend cap was reached"}
    return Finding(True, human.get(str(reason), f"recorded as {reason}"))


@dataclass(frozen=True)
class Repeated:
    check: str
    iterations: tuple[int, ...]
    signatures: tuple[str, ...]
    why: str
    consecutive_same: bool
    resolved_at: int | None
    tests: list[str]                    # the failing test ids, when the runner named them


def repeated_failures(rec: RunRecord, min_times: int = 2) -> list[Repeated]:
    """Checks that failed in ≥ ``min_times`` verified iterations, most failures first."""
    seen: dict[str, list[tuple[int, str, str]]] = {}
    tests: dict[str, list[str]] = {}
    for it in rec.iterations:
        for c in it.failing:
            if environment_failure(c) is None:
                seen.setdefault(c.name, []).append((it.n, c.signature, failure_why(c)))
                tests[c.name] = list(dict.fromkeys(tests.get(c.name, []) + test_ids(c)))
    out = []
    for name, hits in seen.items():
        if len(hits) < min_times:
            continue
        ns = tuple(n for n, _, _ in hits)
        sigs = tuple(dict.fromkeys(s for _, s, _ in hits))
        whys = [w for _, _, w in hits]
        why = max(set(whys), key=lambda w: (whys.count(w), -whys.index(w)))
        same = any(ns[k + 1] == ns[k] + 1 and hits[k + 1][1] == hits[k][1] for k in range(len(hits) - 1))
        later = [it.n for it in rec.iterations if it.n > ns[-1] and it.outcome is not None
                 and all(c.passed for c in it.checks if c.name == name)]
        out.append(Repeated(name, ns, sigs, why, same, later[0] if later else None, tests[name][:20]))
    return sorted(out, key=lambda r: (-len(r.iterations), r.check))


@dataclass(frozen=True)
class Carried:
    section: str            # "skills" or "knowledge"
    id: str
    iterations: tuple[int, ...]
    used: bool
    helped: bool
    evidence: str


def carried(rec: RunRecord, terms: dict[str, Sequence[str]] | None = None) -> list[Carried]:
    """Skills and knowledge the prompts carried, with the used/helped predicates."""
    terms = terms or {}
    out = []
    for section in ("skills", "knowledge"):
        where: dict[str, list[Iteration]] = {}
        for it in rec.iterations:
            for item in it.ids(section):
                where.setdefault(item, []).append(it)
        for item, its in sorted(where.items()):
            words = [t for t in (terms.get(item) or [item]) if t]
            hit = _reference(its, words)
            used = hit is not None or rec.goal_met
            evidence = f"iteration {hit[0]} refers to {hit[1]!r}" if hit else "no act refers to it"
            out.append(Carried(section, item, tuple(it.n for it in its), used, used and rec.goal_met, evidence))
    return out


def _reference(its: list[Iteration], words: Sequence[str]) -> tuple[int, str] | None:
    lowered = [w.casefold() for w in words]
    for it in its:
        text = (it.act_summary + " " + " ".join(str(c) for c in it.tool_calls)).casefold()
        for w, low in zip(words, lowered):
            if low in text:
                return it.n, w
    return None


@dataclass(frozen=True)
class LessonUse:
    written: tuple[int, ...]
    heeded: tuple[int, ...]
    ignored: tuple[int, ...]

    def line(self) -> str:
        if not self.written:
            return "none written"
        return (f"{len(self.written)} written (after iterations {span(self.written)}); heeded after "
                f"{span(self.heeded) or 'none'}; not heeded after {span(self.ignored) or 'none'}")


def lesson_use(rec: RunRecord) -> LessonUse:
    by_n = {it.n: it for it in rec.iterations}
    written, heeded, ignored = [], [], []
    for it in rec.iterations:
        if not it.lesson:
            continue
        written.append(it.n)
        nxt = by_n.get(it.n + 1)
        if nxt is None or nxt.outcome is None:
            continue
        (ignored if _failing_pairs(it) & _failing_pairs(nxt) else heeded).append(it.n)
    return LessonUse(tuple(written), tuple(heeded), tuple(ignored))


@dataclass(frozen=True)
class Budget:
    lines: tuple[str, ...]
    near: tuple[str, ...]

    def line(self) -> str:
        return "; ".join(self.lines) if self.lines else "no caps set"


def budget(rec: RunRecord) -> Budget:
    caps = rec.caps
    used = {"max_iterations": (len(rec.iterations), "iterations"), "budget_tokens": (rec.tokens, "tokens"),
            "budget_usd": (rec.cost_usd, "USD"), "timeout_s": (rec.elapsed_s, "s")}
    lines, near = [], []
    for key, (value, unit) in used.items():
        cap = caps.get(key)
        if not cap:
            continue
        share = value / cap
        lines.append(f"{value:.4g}/{cap:g} {unit} ({share:.0%})")
        if share >= NEAR:
            near.append(key)
    return Budget(tuple(lines), tuple(near))
