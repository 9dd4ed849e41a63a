// The write-through cache of live records: a write of a live execution starts from the record
// this registry last wrote (no SELECT, decode and checksum verify), and the cache always equals
// the file (get() reads the file).
#include <gtest/gtest.h>

#include "helpers.hpp"

namespace custos::registry::test {
namespace {

// The cached copy equals the record as the file has it.
void expect_cache_is_file(Registry& reg, std::string const& id) {
  auto file = reg.get(id);
  ASSERT_TRUE(file) << file.error().message();
  auto cached = reg.cached_record(id);
  ASSERT_TRUE(cached.has_value()) << id << " is not cached";
  EXPECT_EQ(*cached, *file) << id;
  EXPECT_EQ(cached->checksum, record_checksum(*file));
}

BoundaryInfo marker() {
  return {core::Boundary::marker, "", std::string(32, 'a')};
}

TEST(RegistryCache, CachedRecordEqualsTheFileAfterEachKindOfWrite) {
  TempDir t;
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  std::string const id = "ex-1";
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution(id, "act-1")));
  expect_cache_is_file(*reg, id);
  auto const s0 = reg->write_stats();
  CUSTOS_ASSERT_OK(reg->record_staged(id, fake_staged(), marker()));
  expect_cache_is_file(*reg, id);
  CUSTOS_ASSERT_OK(reg->record_committed(id, WriteMode::deferred));
  CUSTOS_ASSERT_OK(reg->record_phase(id, core::Phase::running));
  expect_cache_is_file(*reg, id);
  CUSTOS_ASSERT_OK(reg->record_trigger(id, core::Trigger::user));
  expect_cache_is_file(*reg, id);
  CUSTOS_ASSERT_OK(reg->record_phase(id, core::Phase::stopping));
  expect_cache_is_file(*reg, id);
  core::StreamAccounting acc;
  acc.observed = 10;
  acc.retained = 10;
  acc.complete = true;
  CUSTOS_ASSERT_OK(reg->record_output(id, 0, acc));
  CUSTOS_ASSERT_OK(reg->record_output(id, 1, acc, WriteMode::deferred));
  CUSTOS_ASSERT_OK(reg->record_phase(id, core::Phase::exited));
  expect_cache_is_file(*reg, id);
  CUSTOS_ASSERT_OK(reg->record_publication(id, 0, 5, false));
  expect_cache_is_file(*reg, id);
  CUSTOS_ASSERT_OK(reg->record_phase(id, core::Phase::closed));
  expect_cache_is_file(*reg, id);
  auto const s1 = reg->write_stats();
  // Every write since the record was created found it in the cache.
  EXPECT_EQ(s1.cache_misses, s0.cache_misses);
  EXPECT_GE(s1.cache_hits - s0.cache_hits, 8u);
  // Terminal: dropped from the cache; a later write (publication) loads it from the file.
  CUSTOS_ASSERT_OK(reg->record_terminal(id, fake_terminal()));
  EXPECT_FALSE(reg->cached_record(id).has_value());
  CUSTOS_ASSERT_OK(reg->record_publication(id, 0, 10, true));
  EXPECT_EQ(reg->write_stats().cache_misses, s1.cache_misses + 1);
  EXPECT_FALSE(reg->cached_record(id).has_value());
  auto fin = reg->get(id);
  CUSTOS_ASSERT_OK(fin);
  EXPECT_EQ(fin->phase, core::Phase::terminal);
  EXPECT_TRUE(fin->out.publication_done);

  // Reopen validates every record written through the cache.
  reg.reset();
  auto again = open_ok(t);
  ASSERT_TRUE(again);
  auto q = again->quarantined();
  CUSTOS_ASSERT_OK(q);
  EXPECT_TRUE(q->empty());
  auto rec = again->get(id);
  CUSTOS_ASSERT_OK(rec);
  EXPECT_EQ(*rec, *fin);
}

TEST(RegistryCache, ARefusedWriteLeavesCacheAndRowUnchanged) {
  TempDir t;
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  std::string const id = "ex-1";
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution(id, "act-1")));
  CUSTOS_ASSERT_OK(reg->record_staged(id, fake_staged(), marker()));
  CUSTOS_ASSERT_OK(reg->record_committed(id));
  CUSTOS_ASSERT_OK(reg->record_phase(id, core::Phase::running));
  auto const before_file = reg->get(id);
  CUSTOS_ASSERT_OK(before_file);
  auto const before_cache = reg->cached_record(id);
  ASSERT_TRUE(before_cache.has_value());
  // Illegal progressions and a second, different trigger.
  CUSTOS_EXPECT_ERRC(reg->record_phase(id, core::Phase::starting), Errc::registry_illegal_phase);
  CUSTOS_EXPECT_ERRC(reg->record_staged(id, fake_staged(), marker()), Errc::registry_illegal_phase);
  CUSTOS_ASSERT_OK(reg->record_trigger(id, core::Trigger::user));
  auto const with_trigger = reg->get(id);
  CUSTOS_ASSERT_OK(with_trigger);
  CUSTOS_EXPECT_ERRC(reg->record_trigger(id, core::Trigger::deadline),
                     Errc::registry_illegal_phase);
  auto const after_cache = reg->cached_record(id);
  ASSERT_TRUE(after_cache.has_value());
  EXPECT_EQ(*after_cache, *with_trigger);
  expect_cache_is_file(*reg, id);
  EXPECT_EQ(with_trigger->phase, before_file->phase);
}

TEST(RegistryCache, AFailedTransactionDropsTheEntry) {
  TempDir t;
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  std::string const id = "ex-1";
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution(id, "act-1")));
  CUSTOS_ASSERT_OK(reg->record_staged(id, fake_staged(), marker()));
  CUSTOS_ASSERT_OK(reg->record_committed(id));
  CUSTOS_ASSERT_OK(reg->record_phase(id, core::Phase::running));
  ASSERT_TRUE(reg->cached_record(id).has_value());
  // The file refuses the UPDATE that would store `stopping` (the change itself was legal, so
  // the failure comes after the record was changed and written).
  CUSTOS_ASSERT_OK(reg->transact(Durability::normal, [](sql::Db& db) {
    return db.exec(
        "CREATE TRIGGER refuse_stopping BEFORE UPDATE ON executions WHEN NEW.phase = 'stopping' "
        "BEGIN SELECT RAISE(ABORT, 'test refuses stopping'); END");
  }));
  EXPECT_FALSE(reg->record_phase(id, core::Phase::stopping));
  EXPECT_FALSE(reg->cached_record(id).has_value());
  auto file = reg->get(id);
  CUSTOS_ASSERT_OK(file);
  EXPECT_EQ(file->phase, core::Phase::running);

  // Same in a batch of several jobs (savepoints): a deferred write of another execution shares
  // the transaction, and only the failed job's entry is dropped.
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-2", "act-2")));
  CUSTOS_ASSERT_OK(reg->record_phase("ex-2", core::Phase::starting, WriteMode::deferred));
  EXPECT_FALSE(reg->record_phase(id, core::Phase::stopping));
  EXPECT_FALSE(reg->cached_record(id).has_value());
  expect_cache_is_file(*reg, "ex-2");
  auto ex2 = reg->get("ex-2");
  CUSTOS_ASSERT_OK(ex2);
  EXPECT_EQ(ex2->phase, core::Phase::starting);

  CUSTOS_ASSERT_OK(reg->transact(
      Durability::normal, [](sql::Db& db) { return db.exec("DROP TRIGGER refuse_stopping"); }));
  auto const misses = reg->write_stats().cache_misses;
  CUSTOS_ASSERT_OK(reg->record_phase(id, core::Phase::stopping));
  EXPECT_EQ(reg->write_stats().cache_misses, misses + 1);  // reloaded and verified
  expect_cache_is_file(*reg, id);
}

TEST(RegistryCache, EvictsTheOldestBeyondItsCap) {
  TempDir t;
  OpenOptions o;
  o.record_cache_entries = 3;
  auto reg = open_ok(t, o);
  ASSERT_TRUE(reg);
  for (int i = 0; i < 5; ++i) {
    std::string const id = "ex-" + std::to_string(i);
    CUSTOS_ASSERT_OK(reg->record_authorized(make_execution(id, "act-" + id)));
  }
  EXPECT_FALSE(reg->cached_record("ex-0").has_value());
  EXPECT_FALSE(reg->cached_record("ex-1").has_value());
  for (char const* id : {"ex-2", "ex-3", "ex-4"}) expect_cache_is_file(*reg, id);
  // A write of an evicted record loads it from the file and caches it again, evicting the
  // oldest (ex-2).
  auto const misses = reg->write_stats().cache_misses;
  CUSTOS_ASSERT_OK(reg->record_staged("ex-0", fake_staged(), marker()));
  EXPECT_EQ(reg->write_stats().cache_misses, misses + 1);
  expect_cache_is_file(*reg, "ex-0");
  EXPECT_FALSE(reg->cached_record("ex-2").has_value());
  // A write of a cached record makes it the newest.
  CUSTOS_ASSERT_OK(reg->record_staged("ex-3", fake_staged(), marker()));
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-5", "act-5")));
  EXPECT_FALSE(reg->cached_record("ex-4").has_value());
  for (char const* id : {"ex-0", "ex-3", "ex-5"}) expect_cache_is_file(*reg, id);
}

TEST(RegistryCache, DisabledCacheStillWrites) {
  TempDir t;
  OpenOptions o;
  o.record_cache_entries = 0;
  auto reg = open_ok(t, o);
  ASSERT_TRUE(reg);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("ex-1", "act-1")));
  CUSTOS_ASSERT_OK(reg->record_staged("ex-1", fake_staged(), marker()));
  EXPECT_FALSE(reg->cached_record("ex-1").has_value());
  EXPECT_EQ(reg->write_stats().cache_hits, 0u);
  auto rec = reg->get("ex-1");
  CUSTOS_ASSERT_OK(rec);
  EXPECT_EQ(rec->ownership.state, OwnershipState::staged);
}

}  // namespace
}  // namespace custos::registry::test
