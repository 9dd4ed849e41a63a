// Recovery's storage half: what the registry hands recovery, what a record alone says about its
// process, and the one terminal record of an execution whose end nobody observed. No process is
// involved here (the identity rules and adoption are tested in tests/supervisor/recovery_*).
#include "custos/registry/recovery.hpp"

#include <gtest/gtest.h>

#include "custos/registry/ownership.hpp"

#include "helpers.hpp"

namespace custos::registry::test {
namespace {

void fabricate_running(Registry& reg, std::string const& id, Ownership owner = fake_staged()) {
  owner.state = OwnershipState::staged;
  CUSTOS_ASSERT_OK(reg.record_authorized(make_execution(id, "act-" + id)));
  CUSTOS_ASSERT_OK(reg.record_staged(id, owner, {core::Boundary::cgroup, "/sys/fs/cgroup/x", ""}));
  CUSTOS_ASSERT_OK(reg.record_committed(id));
  CUSTOS_ASSERT_OK(reg.record_phase(id, core::Phase::running));
}

TEST(RegistryRecovery, WorkListsNonTerminalTrustedRecordsAndTheFindings) {
  TempDir t;
  {
    auto reg = open_ok(t);
    ASSERT_TRUE(reg);
    fabricate_running(*reg, "ex-b");
    fabricate_running(*reg, "ex-a", fake_staged(4243, 987655));
    fabricate_running(*reg, "ex-q", fake_staged(4244, 987656));
    CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-done", "act-done")));
    CUSTOS_ASSERT_OK(reg->record_phase("ex-done", core::Phase::starting));
    CUSTOS_ASSERT_OK(reg->record_terminal("ex-done", fake_terminal("spawn_failed")));
    CUSTOS_ASSERT_OK(reg->consume_claim("act-orphan", "proc-1", "ex-orphan"));
  }
  raw_exec(t.db(), "UPDATE executions SET backend='x' WHERE execution_id='ex-q'");
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  auto w = read_recovery_work(*reg);
  ASSERT_TRUE(w) << w.error().message();
  ASSERT_EQ(w->records.size(), 2U);
  EXPECT_EQ(w->records[0].execution_id, "ex-a");  // id order
  EXPECT_EQ(w->records[1].execution_id, "ex-b");
  EXPECT_EQ(w->already_terminal, 1U);
  ASSERT_EQ(w->quarantined.size(), 1U);
  EXPECT_EQ(w->quarantined[0].execution_id, "ex-q");
  ASSERT_EQ(w->orphan_claims.size(), 1U);
  EXPECT_EQ(w->orphan_claims[0].execution_id, "ex-orphan");
  // Reading changes nothing.
  EXPECT_EQ(reg->get("ex-a")->phase, core::Phase::running);
}

TEST(RegistryRecovery, StoredEvidenceFollowsTheOwnershipSlot) {
  ExecutionRecord rec;
  rec.ownership.state = OwnershipState::unassigned;
  EXPECT_EQ(stored_evidence(rec), StoredEvidence::nothing_staged);
  rec.ownership.state = OwnershipState::legacy_unverified;
  EXPECT_EQ(stored_evidence(rec), StoredEvidence::legacy);
  rec.ownership.state = OwnershipState::staged;
  EXPECT_EQ(stored_evidence(rec), StoredEvidence::pidfs_identity);
  rec.ownership.state = OwnershipState::committed;
  EXPECT_EQ(stored_evidence(rec), StoredEvidence::pidfs_identity);
}

TEST(RegistryRecovery, AnUnobservedEndIsOneIndeterminateRecordWithIncompleteOutput) {
  TempDir t;
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  fabricate_running(*reg, "ex-gone");
  CUSTOS_ASSERT_OK(reg->record_trigger("ex-gone", core::Trigger::user));
  CUSTOS_ASSERT_OK(reg->record_output("ex-gone", 0, core::StreamAccounting{5, 5, 0, true}));
  auto rec = reg->get("ex-gone");
  ASSERT_TRUE(rec);

  CUSTOS_ASSERT_OK(record_unobserved_end(*reg, *rec, core::RecoveryPath::absent_without_terminal,
                                         core::Cleanup::confirmed));
  auto after = reg->get("ex-gone");
  ASSERT_TRUE(after && after->terminal);
  EXPECT_EQ(after->phase, core::Phase::terminal);
  EXPECT_EQ(after->terminal->classification, "recovery_indeterminate");
  EXPECT_EQ(after->terminal->recovery, "absent_without_terminal");
  auto t1 = decode_terminal(*after->terminal);
  ASSERT_TRUE(t1) << t1.error().message();
  EXPECT_TRUE(core::validate(*t1));
  EXPECT_EQ(t1->trigger, core::Trigger::user);
  EXPECT_EQ(t1->tree.cleanup, core::Cleanup::confirmed);
  EXPECT_EQ(t1->tree.boundary, core::Boundary::cgroup);
  EXPECT_EQ(t1->tree.containment, core::Containment::escapable);
  // In-flight output is never reported complete after a crash; what was counted stays.
  EXPECT_EQ(t1->output.at(core::Stream::stdout_stream), (core::StreamAccounting{5, 5, 0, false}));
  EXPECT_FALSE(t1->output.at(core::Stream::stderr_stream).complete);
  for (auto const& d : t1->resources.dims) EXPECT_EQ(d.fidelity, core::Fidelity::unavailable);

  // Exactly one.
  CUSTOS_EXPECT_ERRC(record_unobserved_end(*reg, *rec, core::RecoveryPath::indeterminate,
                                           core::Cleanup::unconfirmed),
                     Errc::registry_illegal_phase);
  CUSTOS_EXPECT_ERRC(reg->record_terminal("ex-gone", fake_terminal()),
                     Errc::registry_illegal_phase);
}

TEST(RegistryRecovery, AnUnobservedEndIsNeverRecordedAsObservedOrLive) {
  TempDir t;
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  fabricate_running(*reg, "ex-1");
  auto rec = reg->get("ex-1");
  ASSERT_TRUE(rec);
  for (auto via : {core::RecoveryPath::observed, core::RecoveryPath::live_owned,
                   core::RecoveryPath::already_terminal}) {
    CUSTOS_EXPECT_ERRC(record_unobserved_end(*reg, *rec, via, core::Cleanup::confirmed),
                       Errc::lifecycle_illegal_transition);
  }
  EXPECT_EQ(reg->get("ex-1")->phase, core::Phase::running);
}

}  // namespace
}  // namespace custos::registry::test
