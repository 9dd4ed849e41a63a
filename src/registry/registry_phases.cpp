// Registry: the writes that move a record through its life (ownership, phases, trigger,
// accounting, publication, the terminal record).
#include <vector>

#include "custos/core/digest.hpp"
#include "custos/registry/failpoint.hpp"
#include "custos/registry/registry.hpp"

#include "registry_internal.hpp"

namespace custos::registry {

// ---- records: writes --------------------------------------------------------------------------

namespace {
Error illegal_step(ExecutionRecord const& rec, std::string what) {
  return Error{Errc::registry_illegal_phase,
               rec.execution_id + " (phase " + std::string{core::phase_wire(rec.phase)} +
                   ", ownership " + std::string{ownership_state_wire(rec.ownership.state)} +
                   "): " + std::move(what)};
}

Result<void> step_phase(ExecutionRecord& rec, core::Phase to,
                        core::RecoveryPath via = core::RecoveryPath::observed) {
  if (!core::is_legal_progression(rec.phase, to, via)) {
    return illegal_step(rec, "illegal progression to " + std::string{core::phase_wire(to)});
  }
  rec.phase = to;
  return ok();
}
}  // namespace

namespace {
// Ownership unassigned -> staged (and the phase authorized -> starting when needed).
std::function<Result<void>(ExecutionRecord&)> staged_change(Ownership staged,
                                                            BoundaryInfo boundary) {
  return [staged = std::move(staged),
          boundary = std::move(boundary)](ExecutionRecord& rec) -> Result<void> {
    if (rec.ownership.state == OwnershipState::legacy_unverified) {
      return Error{Errc::registry_legacy_unverified,
                   rec.execution_id + ": legacy ownership is never replaced"};
    }
    if (rec.ownership.state != OwnershipState::unassigned) {
      return illegal_step(rec, "ownership already assigned");
    }
    if (rec.phase == core::Phase::authorized) {
      CUSTOS_TRYV(step_phase(rec, core::Phase::starting));
    } else if (rec.phase != core::Phase::starting) {
      return illegal_step(rec, "staging outside the starting phase");
    }
    rec.ownership = staged;
    rec.boundary = boundary;
    return ok();
  };
}

// Ownership staged -> committed (the phase stays starting).
Result<void> commit_ownership(ExecutionRecord& rec) {
  if (rec.ownership.state == OwnershipState::legacy_unverified) {
    return Error{Errc::registry_legacy_unverified,
                 rec.execution_id + ": legacy ownership cannot be committed"};
  }
  if ((rec.ownership.state == OwnershipState::modelled ||
       rec.ownership.state == OwnershipState::marked) &&
      rec.phase == core::Phase::starting) {
    return ok();  // a model or a marked exec has no process slot to commit: it stays as it is
  }
  if (rec.ownership.state != OwnershipState::staged || rec.phase != core::Phase::starting) {
    return illegal_step(rec, "commit needs staged ownership while starting");
  }
  rec.ownership.state = OwnershipState::committed;
  return ok();
}

// The slots a running execution may have: a committed pidfs identity, a model, a marked exec.
bool runs_ownership(OwnershipState s) noexcept {
  return s == OwnershipState::committed || s == OwnershipState::modelled ||
         s == OwnershipState::marked;
}

Result<void> staged_ownership_check(Ownership const& staged) {
  if (staged.state == OwnershipState::staged || staged.state == OwnershipState::modelled ||
      staged.state == OwnershipState::marked)
    return ok();
  return Error{Errc::registry_illegal_phase,
               "record_staged needs an ownership in state staged (or modelled, or marked)"};
}

}  // namespace

Result<void> Registry::record_staged(std::string_view execution_id, Ownership const& staged,
                                     BoundaryInfo const& boundary) {
  failpoint("before_staged");
  CUSTOS_TRYV(staged_ownership_check(staged));
  // Always immediate: the barrier is released only after this returned.
  if (auto wr = modify(options_.ownership_durability, WriteMode::now, execution_id, "record_staged",
                       staged_change(staged, boundary));
      !wr)
    return std::move(wr).error();
  failpoint("after_staged");
  return ok();
}

void Registry::record_staged_async(std::string_view execution_id, Ownership staged,
                                   BoundaryInfo boundary, std::function<void(Result<void>)> done) {
  failpoint("before_staged");
  if (auto checked = staged_ownership_check(staged); !checked) return done(std::move(checked));
  (void)modify(options_.ownership_durability, WriteMode::deferred, execution_id, "record_staged",
               staged_change(std::move(staged), std::move(boundary)), true,
               detail::after_commit({"after_staged"}, std::move(done)));
}

Result<void> Registry::record_committed(std::string_view execution_id, WriteMode mode) {
  if (auto wr = modify(options_.ownership_durability, mode, execution_id, "record_committed",
                       commit_ownership);
      !wr)
    return std::move(wr).error();
  failpoint("after_committed");
  return ok();
}

void Registry::record_running_async(std::string_view execution_id,
                                    std::function<void(Result<void>)> done) {
  // One change: both steps or neither (running needs the committed slot).
  (void)modify(
      options_.ownership_durability, WriteMode::deferred, execution_id, "record_committed",
      [](ExecutionRecord& rec) -> Result<void> {
        CUSTOS_TRYV(commit_ownership(rec));
        return step_phase(rec, core::Phase::running);
      },
      true, detail::after_commit({"after_committed", "while_running"}, std::move(done)));
}

Result<void> Registry::record_phase(std::string_view execution_id, core::Phase phase,
                                    WriteMode mode) {
  if (phase == core::Phase::terminal) {
    return Error{Errc::registry_illegal_phase, "terminal is written by record_terminal only"};
  }
  if (auto wr =
          modify(options_.ownership_durability, mode, execution_id, "record_phase",
                 [phase](ExecutionRecord& rec) -> Result<void> {
                   if (phase == core::Phase::running && !runs_ownership(rec.ownership.state)) {
                     return illegal_step(rec, "running needs committed pidfs ownership");
                   }
                   return step_phase(rec, phase);
                 });
      !wr)
    return std::move(wr).error();
  if (phase == core::Phase::running) failpoint("while_running");
  if (phase == core::Phase::stopping) failpoint("while_stopping");
  return ok();
}

Result<void> Registry::record_trigger(std::string_view execution_id, core::Trigger trigger,
                                      WriteMode mode) {
  return modify(options_.ownership_durability, mode, execution_id, "record_trigger",
                [trigger](ExecutionRecord& rec) -> Result<void> {
                  if (rec.phase == core::Phase::terminal) {
                    return illegal_step(rec, "trigger after the terminal record");
                  }
                  if (rec.trigger && *rec.trigger != trigger) {
                    return illegal_step(rec, "a different trigger was accepted first (" +
                                                 std::string{core::trigger_wire(*rec.trigger)} +
                                                 ")");
                  }
                  rec.trigger = trigger;
                  return ok();
                });
}

Result<void> Registry::record_output(std::string_view execution_id, int stream_index,
                                     core::StreamAccounting const& accounting, WriteMode mode) {
  if (stream_index != 0 && stream_index != 1) {
    return Error{Errc::internal, "stream index must be 0 or 1"};
  }
  CUSTOS_TRYV(accounting.check());
  return modify(options_.ownership_durability, mode, execution_id, "record_output",
                [stream_index, accounting](ExecutionRecord& rec) -> Result<void> {
                  if (rec.phase == core::Phase::terminal) {
                    return illegal_step(rec, "accounting after the terminal record");
                  }
                  auto& s = stream_index == 0 ? rec.out : rec.err;
                  if (accounting.observed < s.accounting.observed) {
                    return Error{Errc::accounting_invariant,
                                 rec.execution_id + ": observed bytes went backwards"};
                  }
                  s.accounting = accounting;
                  return ok();
                });
}

Result<void> Registry::record_publication(std::string_view execution_id, int stream_index,
                                          std::uint64_t published_bytes, bool done,
                                          WriteMode mode) {
  if (stream_index != 0 && stream_index != 1) {
    return Error{Errc::internal, "stream index must be 0 or 1"};
  }
  // Publication happens after the terminal record and never rewrites it: only the progress
  // columns change.
  return modify(options_.ownership_durability, mode, execution_id, "record_publication",
                [stream_index, published_bytes, done](ExecutionRecord& rec) -> Result<void> {
                  auto& s = stream_index == 0 ? rec.out : rec.err;
                  if (published_bytes < s.published_bytes || (s.publication_done && !done)) {
                    return Error{Errc::accounting_invariant,
                                 rec.execution_id + ": publication progress went backwards"};
                  }
                  s.published_bytes = published_bytes;
                  s.publication_done = done;
                  return ok();
                });
}

namespace {
// An outcome the stream's accounting contradicts is refused as such (accounting.invariant),
// before the record's own validation would call the result corrupt.
Result<void> outcome_fits(std::string const& id, core::StreamAccounting const& acc,
                          StreamPublication const& o) {
  auto bad = [&id](char const* what) {
    return Error{Errc::accounting_invariant, id + ": " + what};
  };
  switch (o.state) {
    case PublicationState::published:
      if (acc.retained == 0 || o.bytes != acc.retained)
        return bad("a published artifact holds exactly the stream's retained bytes");
      if (!core::Digest::parse(o.artifact)) return bad("malformed artifact digest");
      break;
    case PublicationState::empty:
      if (acc.retained != 0) return bad("an empty publication of a stream with retained bytes");
      break;
    case PublicationState::lost:
      if (acc.retained == 0) return bad("a lost publication of a stream with nothing retained");
      [[fallthrough]];
    case PublicationState::failed:
      if (o.error.empty()) return bad("a failed or lost publication without its error");
      break;
    case PublicationState::pending:
      break;
  }
  return ok();
}
}  // namespace

Result<void> Registry::record_publication(std::string_view execution_id, int stream_index,
                                          StreamPublication const& outcome) {
  if (stream_index != 0 && stream_index != 1) {
    return Error{Errc::internal, "stream index must be 0 or 1"};
  }
  if (outcome.state == PublicationState::pending) {
    return Error{Errc::internal, "pending is where a publication starts, not an outcome"};
  }
  return modify(
      options_.ownership_durability, WriteMode::now, execution_id, "record_publication",
      [stream_index, outcome](ExecutionRecord& rec) -> Result<void> {
        if (rec.phase != core::Phase::terminal) {
          return Error{Errc::registry_illegal_phase,
                       rec.execution_id + ": publication before the terminal record"};
        }
        auto& s = stream_index == 0 ? rec.out : rec.err;
        CUSTOS_TRYV(outcome_fits(rec.execution_id, s.accounting, outcome));
        StreamProgress next = s;
        next.publication = outcome.state;
        next.publication_done = outcome.state == PublicationState::published ||
                                outcome.state == PublicationState::empty ||
                                outcome.state == PublicationState::lost;
        next.published_bytes = outcome.state == PublicationState::published ? outcome.bytes : 0;
        next.artifact = outcome.state == PublicationState::published ? outcome.artifact : "";
        next.publication_error =
            outcome.state == PublicationState::failed || outcome.state == PublicationState::lost
                ? outcome.error
                : "";
        // Idempotent: a done stream keeps its outcome; the same one again is no change.
        if (s.publication_done && s.publication != PublicationState::pending) {
          if (next == s) return ok();
          return Error{Errc::registry_illegal_phase,
                       rec.execution_id + ": stream " + std::to_string(stream_index) +
                           " is already " + std::string{publication_state_wire(s.publication)}};
        }
        s = std::move(next);
        return ok();
      });
}

namespace {
// A terminal blob whose digest does not match its bytes is refused before anything is queued.
Result<void> check_terminal_digest(std::string_view execution_id, TerminalBlob const& t) {
  if (t.digest == sha256_tagged(t.bytes)) return ok();
  return Error{Errc::registry_corrupt_record,
               std::string{execution_id} + ": terminal digest does not match its bytes"};
}

// The terminal write's change (owns its blob: a deferred change runs after its caller returned).
std::function<Result<void>(ExecutionRecord&)> terminal_change(TerminalBlob t,
                                                              core::RecoveryPath via) {
  return [t = std::move(t), via](ExecutionRecord& rec) -> Result<void> {
    if (rec.phase == core::Phase::terminal) {
      return illegal_step(rec, "a terminal record exists; exactly one is allowed");
    }
    CUSTOS_TRYV(step_phase(rec, core::Phase::terminal, via));
    rec.terminal = t;
    return ok();
  };
}
}  // namespace

Result<void> Registry::record_terminal(std::string_view execution_id, TerminalBlob const& t,
                                       core::RecoveryPath via) {
  failpoint("before_terminal");
  forget_group_note(execution_id);
  CUSTOS_TRYV(check_terminal_digest(execution_id, t));
  // Immediate: queued deferred writes are committed first, in this same transaction.
  return modify(options_.terminal_durability, WriteMode::now, execution_id, "record_terminal",
                terminal_change(t, via));
}

void Registry::record_terminal_async(std::string_view execution_id, TerminalBlob t,
                                     core::RecoveryPath via,
                                     std::function<void(Result<void>)> done) {
  failpoint("before_terminal");
  forget_group_note(execution_id);
  if (auto ok_digest = check_terminal_digest(execution_id, t); !ok_digest) {
    return done(std::move(ok_digest));
  }
  // Deferred, so nobody blocks on it; the change owns its blob (it runs after this returns).
  (void)modify(options_.terminal_durability, WriteMode::deferred, execution_id, "record_terminal",
               terminal_change(std::move(t), via), true, std::move(done));
}

Result<void> Registry::record_recovered(std::string_view execution_id,
                                        std::vector<core::Phase> const& steps,
                                        TerminalBlob const& t, core::RecoveryPath via) {
  CUSTOS_TRYV(check_terminal_digest(execution_id, t));
  return modify(
      options_.terminal_durability, WriteMode::now, execution_id, "record_recovered",
      [&steps, &t, via](ExecutionRecord& rec) -> Result<void> {
        for (core::Phase const p : steps) {
          if (p == core::Phase::terminal) return illegal_step(rec, "terminal in steps");
          if (p == core::Phase::running && !runs_ownership(rec.ownership.state)) {
            return illegal_step(rec, "running needs committed pidfs ownership");
          }
          CUSTOS_TRYV(step_phase(rec, p));
        }
        if (rec.phase == core::Phase::terminal) {
          return illegal_step(rec, "a terminal record exists; exactly one is allowed");
        }
        CUSTOS_TRYV(step_phase(rec, core::Phase::terminal, via));
        rec.terminal = t;
        return ok();
      },
      /*atomic=*/false);
}

}  // namespace custos::registry
