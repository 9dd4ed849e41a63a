// Execution record: wire names, canonical bytes, checksum and structural validation.

#include "custos/core/canonical.hpp"
#include "custos/core/digest.hpp"
#include "custos/core/plan_canonical.hpp"
#include "custos/core/wire_names.hpp"
#include "custos/registry/registry.hpp"

namespace custos::registry {

namespace {

constexpr auto kOwnershipStateNames = core::wire_names<OwnershipState>({
    {OwnershipState::unassigned, "unassigned"},
    {OwnershipState::staged, "staged"},
    {OwnershipState::committed, "committed"},
    {OwnershipState::legacy_unverified, "legacy_unverified"},
    {OwnershipState::modelled, "modelled"},
    {OwnershipState::marked, "marked"},
});
static_assert(kOwnershipStateNames.complete());

constexpr auto kPublicationStateNames = core::wire_names<PublicationState>({
    {PublicationState::pending, "pending"},
    {PublicationState::published, "published"},
    {PublicationState::empty, "empty"},
    {PublicationState::failed, "failed"},
    {PublicationState::lost, "lost"},
});
static_assert(kPublicationStateNames.complete());

// Record kinds of the registry range (canonical.hpp: 0x0300-0x03FF).
constexpr core::RecordKind kKindExecutionRecord = 0x0300;
constexpr core::RecordKind kKindStreamProgress = 0x0301;
constexpr core::RecordKind kKindTerminalBlob = 0x0302;

// Tags of kKindExecutionRecord. Never renumbered: records written by older schema versions are
// verified with these same tags (docs/registry.md "Checksum").
enum : core::Tag {
  kTagExecutionId = 1,
  kTagActionId = 2,
  kTagProcessId = 3,
  kTagSessionId = 4,
  kTagPlanCanonical = 5,
  kTagPlanDigest = 6,
  kTagBackend = 7,
  kTagBoundaryKind = 8,
  kTagCgroupPath = 9,
  kTagMarker = 10,
  kTagPhase = 11,
  kTagPid = 12,        // v1: the pid of the owned process; since v2 the locator of any slot
  kTagStartTime = 13,  // v1: its start time; since v2 negative evidence
  kTagTrigger = 14,
  kTagOut = 15,
  kTagErr = 16,
  kTagTerminal = 17,
  // v2: pidfs ownership. Absent for unassigned and legacy_unverified slots, so a v1 record with
  // pid + start time encodes exactly as the legacy_unverified record it migrates to.
  kTagOwnershipState = 20,
  kTagBootId = 21,
  kTagPidfsDev = 22,
  kTagPidfsIno = 23,
  kTagPidNsIno = 24,
  // v6: the PID namespace of a container execution's marker sweep (absent when 0).
  kTagMarkerNsIno = 25,
};

void write_stream(core::CanonicalWriter& w, core::Tag tag, StreamProgress const& s) {
  if (s == StreamProgress{}) return;  // default: omitted
  w.record(tag, kKindStreamProgress, [&](core::CanonicalWriter& r) {
    r.u64(1, s.accounting.observed);
    r.u64(2, s.accounting.retained);
    r.u64(3, s.accounting.dropped);
    r.boolean(4, s.accounting.complete);
    // v3 additions, omitted at their defaults so v2 records keep their bytes.
    if (s.published_bytes != 0) r.u64(5, s.published_bytes);
    if (s.publication_done) r.boolean(6, true);
    // v7 additions, likewise omitted at their defaults.
    if (s.publication != PublicationState::pending)
      r.string(7, kPublicationStateNames.wire(s.publication));
    if (!s.artifact.empty()) r.string(8, s.artifact);
    if (!s.publication_error.empty()) r.string(9, s.publication_error);
  });
}

}  // namespace

std::string_view boundary_kind_wire(BoundaryKind k) noexcept {
  return k ? core::boundary_wire(*k) : std::string_view{"none"};
}

std::optional<BoundaryKind> boundary_kind_from_wire(std::string_view w) noexcept {
  if (w == "none") return BoundaryKind{};
  if (auto b = core::boundary_from_wire(w)) return BoundaryKind{*b};
  return std::nullopt;
}

std::string_view ownership_state_wire(OwnershipState s) noexcept {
  return kOwnershipStateNames.wire(s);
}

std::optional<OwnershipState> ownership_state_from_wire(std::string_view w) noexcept {
  return kOwnershipStateNames.from_wire(w);
}

std::string_view publication_state_wire(PublicationState s) noexcept {
  return kPublicationStateNames.wire(s);
}

std::optional<PublicationState> publication_state_from_wire(std::string_view w) noexcept {
  return kPublicationStateNames.from_wire(w);
}

std::string sha256_tagged(std::span<std::uint8_t const> bytes) {
  // core::sha256 can only fail on allocation failure inside OpenSSL; an empty result then makes
  // every comparison fail closed (the record is treated as corrupt, never as valid).
  auto d = core::sha256(bytes);
  if (!d) return {};
  return d->to_string();
}

std::vector<std::uint8_t> record_canonical_bytes(ExecutionRecord const& rec) {
  core::CanonicalWriter w{kKindExecutionRecord};
  w.string(kTagExecutionId, rec.execution_id);
  w.string(kTagActionId, rec.action_id);
  w.string(kTagProcessId, rec.process_id);
  w.string(kTagSessionId, rec.session_id);
  w.bytes(kTagPlanCanonical, rec.plan_canonical);
  w.string(kTagPlanDigest, rec.plan_digest);
  w.string(kTagBackend, rec.backend);
  if (rec.boundary.kind) {
    w.string(kTagBoundaryKind, boundary_kind_wire(rec.boundary.kind));
  }
  if (!rec.boundary.cgroup_path.empty()) w.string(kTagCgroupPath, rec.boundary.cgroup_path);
  if (!rec.boundary.marker_hex.empty()) w.string(kTagMarker, rec.boundary.marker_hex);
  w.string(kTagPhase, core::phase_wire(rec.phase));
  auto const& o = rec.ownership;
  if (o.has_pid()) {
    w.i64(kTagPid, o.pid);
    w.u64(kTagStartTime, o.start_time_ticks);
  } else if (o.state == OwnershipState::marked && o.start_time_ticks != 0) {
    w.u64(kTagStartTime, o.start_time_ticks);
  }
  if (rec.trigger) w.string(kTagTrigger, core::trigger_wire(*rec.trigger));
  write_stream(w, kTagOut, rec.out);
  write_stream(w, kTagErr, rec.err);
  if (rec.terminal) {
    w.record(kTagTerminal, kKindTerminalBlob, [&](core::CanonicalWriter& r) {
      r.bytes(1, rec.terminal->bytes);
      r.string(2, rec.terminal->digest);
      r.string(3, rec.terminal->classification);
      r.string(4, rec.terminal->recovery);
    });
  }
  if (o.has_pidfs_authority()) {
    w.string(kTagOwnershipState, ownership_state_wire(o.state));
    w.string(kTagBootId, o.boot_id);
    w.u64(kTagPidfsDev, o.pidfs_dev);
    w.u64(kTagPidfsIno, o.pidfs_ino);
    if (o.pid_ns_ino != 0) w.u64(kTagPidNsIno, o.pid_ns_ino);
  } else if (o.state == OwnershipState::modelled || o.state == OwnershipState::marked) {
    w.string(kTagOwnershipState, ownership_state_wire(o.state));
  }
  if (rec.boundary.marker_ns_ino != 0) w.u64(kTagMarkerNsIno, rec.boundary.marker_ns_ino);
  return std::move(w).finish();
}

std::string record_checksum(ExecutionRecord const& rec) {
  return sha256_tagged(record_canonical_bytes(rec));
}

namespace {

Error corrupt(ExecutionRecord const& rec, std::string why) {
  return Error{Errc::registry_corrupt_record, rec.execution_id + ": " + std::move(why)};
}
Error illegal(ExecutionRecord const& rec, std::string why) {
  return Error{Errc::registry_illegal_phase, rec.execution_id + ": " + std::move(why)};
}

bool looks_like_boot_id(std::string_view s) {
  // 8-4-4-4-12 lowercase hex, as /proc/sys/kernel/random/boot_id prints it.
  if (s.size() != 36) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    char const c = s[i];
    bool const dash = (i == 8 || i == 13 || i == 18 || i == 23);
    if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

Result<void> validate_record(ExecutionRecord const& rec, bool deep) {
  // Integrity first: nothing else about a record whose bytes changed is meaningful.
  if (rec.checksum.empty() || rec.checksum != record_checksum(rec)) {
    return corrupt(rec, "checksum mismatch (stored " + rec.checksum + ")");
  }
  if (rec.plan_digest != sha256_tagged(rec.plan_canonical)) {
    return corrupt(rec, "plan digest does not match the canonical plan bytes");
  }
  return validate_record_content(rec, deep);
}

namespace {

// A stream's publication columns agree with each other and with its accounting.
Result<void> check_publication(StreamProgress const& s) {
  auto bad = [](std::string what) { return Error{Errc::accounting_invariant, std::move(what)}; };
  bool const done = s.publication == PublicationState::published ||
                    s.publication == PublicationState::empty ||
                    s.publication == PublicationState::lost;
  // A pending stream may carry the v3 progress columns as older writers left them.
  if (s.publication != PublicationState::pending && done != s.publication_done)
    return bad("publication done flag disagrees with its state");
  if ((s.publication == PublicationState::published) != !s.artifact.empty())
    return bad("an artifact digest belongs to a published stream, and only to one");
  switch (s.publication) {
    case PublicationState::published:
      if (s.published_bytes != s.accounting.retained || s.accounting.retained == 0)
        return bad("a published stream's artifact holds exactly its retained bytes (> 0)");
      if (!core::Digest::parse(s.artifact)) return bad("malformed artifact digest");
      break;
    case PublicationState::empty:
      if (s.accounting.retained != 0) return bad("an empty publication with retained bytes");
      break;
    case PublicationState::lost:
      if (s.accounting.retained == 0) return bad("a lost publication without retained bytes");
      [[fallthrough]];
    case PublicationState::failed:
      if (s.publication_error.empty()) return bad("a failed or lost publication without error");
      break;
    case PublicationState::pending:
      break;
  }
  return ok();
}

}  // namespace

Result<void> validate_record_content(ExecutionRecord const& rec, bool deep) {
  if (rec.execution_id.empty() || rec.action_id.empty() || rec.process_id.empty()) {
    return corrupt(rec, "empty execution, action or process id");
  }
  if (deep) {
    auto req = core::decode_execution(rec.plan_canonical);
    if (!req) return corrupt(rec, "canonical plan bytes do not decode: " + req.error().message());
    if (req->identity.action_id != rec.action_id || req->identity.process_id != rec.process_id ||
        req->identity.session_id != rec.session_id) {
      return corrupt(rec, "action/process/session columns disagree with the canonical plan");
    }
  }
  if (rec.terminal) {
    if (rec.terminal->digest != sha256_tagged(rec.terminal->bytes)) {
      return corrupt(rec, "terminal digest does not match the terminal record bytes");
    }
    if (!core::classification_from_wire(rec.terminal->classification)) {
      return corrupt(rec, "unknown terminal classification '" + rec.terminal->classification + "'");
    }
    if (!core::recovery_path_from_wire(rec.terminal->recovery)) {
      return corrupt(rec, "unknown terminal recovery path '" + rec.terminal->recovery + "'");
    }
  }
  if ((rec.phase == core::Phase::terminal) != rec.terminal.has_value()) {
    return illegal(rec, rec.terminal ? "terminal record present in a non-terminal phase"
                                     : "phase terminal without a terminal record");
  }
  auto const& o = rec.ownership;
  if (o.has_pidfs_authority()) {
    if (!looks_like_boot_id(o.boot_id) || o.pidfs_ino == 0 || o.pid <= 0) {
      return corrupt(rec, "incomplete pidfs identity in the ownership slot");
    }
  } else if (o.state == OwnershipState::legacy_unverified) {
    if (o.pid <= 0) return corrupt(rec, "legacy ownership without a pid");
  } else if (o.state == OwnershipState::modelled) {
    if (o.pid != 0 || rec.boundary.kind != core::Boundary::reference) {
      return corrupt(rec, "modelled ownership is the reference boundary's, without a pid");
    }
  } else if (o.state == OwnershipState::marked) {
    if (o.pid != 0 || rec.boundary.kind != core::Boundary::marker ||
        rec.boundary.marker_hex.empty()) {
      return corrupt(rec, "marked ownership is a marker boundary's, with a marker, without a pid");
    }
  }
  // Which ownership each phase allows (docs/registry.md "Ownership by phase").
  switch (rec.phase) {
    case core::Phase::authorized:
      if (o.state != OwnershipState::unassigned) {
        return illegal(rec, "authorized with an assigned ownership slot");
      }
      break;
    case core::Phase::starting:
      break;  // unassigned (before clone), staged (at the barrier), committed (just released)
    case core::Phase::running:
    case core::Phase::stopping:
    case core::Phase::exited:
    case core::Phase::closed:
      if (!o.started()) {
        return illegal(rec, std::string{core::phase_wire(rec.phase)} +
                                " without committed ownership (" +
                                std::string{ownership_state_wire(o.state)} + ")");
      }
      break;
    case core::Phase::terminal:
      break;
  }
  if (rec.boundary.kind == core::Boundary::cgroup &&
      (rec.boundary.cgroup_path.empty() || rec.boundary.cgroup_path.front() != '/')) {
    return corrupt(rec, "cgroup boundary without an absolute cgroup path");
  }
  for (auto const* s : {&rec.out, &rec.err}) {
    if (auto r = s->accounting.check(); !r) return corrupt(rec, r.error().message());
    if (s->published_bytes > s->accounting.retained) {
      return corrupt(rec, "more bytes published than retained");
    }
    if (auto r = check_publication(*s); !r) return corrupt(rec, r.error().message());
  }
  if (!rec.terminal && (rec.out.publication != PublicationState::pending ||
                        rec.err.publication != PublicationState::pending)) {
    return illegal(rec, "publication before the terminal record");
  }
  return ok();
}

}  // namespace custos::registry
