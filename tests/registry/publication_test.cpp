// Output publication in the registry and the artifact store: the v7 columns and their
// migration, the rules of record_publication (terminal only, idempotent, never contradicting
// the accounting), the store's digests and dedup, the read path, and retention.
#include <gtest/gtest.h>

#include <fstream>
#include <sys/stat.h>
#include <utime.h>

#include "custos/core/digest.hpp"
#include "custos/registry/artifacts.hpp"

#include "helpers.hpp"

namespace custos::registry::test {
namespace {

namespace fs = std::filesystem;

// A terminal execution whose streams retained `out` and `err` bytes (complete when not
// truncated: observed == retained).
void terminal_with_output(Registry& reg, std::string const& id, std::uint64_t out,
                          std::uint64_t err, bool complete = true) {
  CUSTOS_ASSERT_OK(reg.record_authorized(make_execution(id, "act-" + id)));
  CUSTOS_ASSERT_OK(reg.record_staged(
      id, fake_staged(), boundary_info(core::Boundary::marker, "", std::string(32, 'a'))));
  CUSTOS_ASSERT_OK(reg.record_committed(id));
  CUSTOS_ASSERT_OK(reg.record_phase(id, core::Phase::running));
  CUSTOS_ASSERT_OK(reg.record_phase(id, core::Phase::exited));
  CUSTOS_ASSERT_OK(reg.record_phase(id, core::Phase::closed));
  auto acc = [complete](std::uint64_t n) {
    return core::StreamAccounting{complete ? n : n + 5, n, complete ? 0 : 5U, complete};
  };
  CUSTOS_ASSERT_OK(reg.record_output(id, 0, acc(out)));
  CUSTOS_ASSERT_OK(reg.record_output(id, 1, acc(err)));
  CUSTOS_ASSERT_OK(reg.record_terminal(id, fake_terminal()));
}

void write_file(fs::path const& p, std::string const& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary);
  f << bytes;
}

std::string read_file(fs::path const& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string digest_of(std::string const& bytes) {
  return core::sha256(std::span<std::uint8_t const>(
                          reinterpret_cast<std::uint8_t const*>(bytes.data()), bytes.size()))
      ->to_string();
}

StreamPublication published(std::uint64_t bytes, std::string digest) {
  return StreamPublication{PublicationState::published, bytes, std::move(digest), {}};
}

TEST(RegistryPublication, FromV6AddsPublicationStateAndKeepsRecords) {
  TempDir t;
  {
    auto reg = open_ok(t);
    terminal_with_output(*reg, "ex-6", 4, 0);
  }
  raw_exec(t.db(),
           "ALTER TABLE executions DROP COLUMN out_pub_state; "
           "ALTER TABLE executions DROP COLUMN out_artifact; "
           "ALTER TABLE executions DROP COLUMN out_pub_error; "
           "ALTER TABLE executions DROP COLUMN err_pub_state; "
           "ALTER TABLE executions DROP COLUMN err_artifact; "
           "ALTER TABLE executions DROP COLUMN err_pub_error; "
           "UPDATE meta SET value = '6' WHERE key = 'schema_version';");
  auto reg = open_ok(t);
  ASSERT_TRUE(reg);
  EXPECT_EQ(reg->opened_version(), 6);
  EXPECT_TRUE(reg->quarantined()->empty()) << "a v6 record keeps its checksum";
  auto rec = reg->get("ex-6");
  ASSERT_TRUE(rec) << rec.error().message();
  EXPECT_EQ(rec->out.publication, PublicationState::pending);
  EXPECT_TRUE(rec->out.artifact.empty());
  // A terminal v6 record is one publication still to do.
  auto todo = reg->unpublished("", 10);
  ASSERT_TRUE(todo);
  ASSERT_EQ(todo->size(), 1U);
  CUSTOS_ASSERT_OK(reg->record_publication("ex-6", 0, published(4, digest_of("abcd"))));
  CUSTOS_ASSERT_OK(
      reg->record_publication("ex-6", 1, StreamPublication{PublicationState::empty, 0, {}, {}}));
  EXPECT_TRUE(reg->unpublished("", 10)->empty());
  auto done = reg->get("ex-6");
  ASSERT_TRUE(done);
  EXPECT_EQ(done->out.artifact, digest_of("abcd"));
  EXPECT_EQ(done->checksum, record_checksum(*done));
  reg.reset();
  // The digest is covered by the record's checksum: changed behind the registry's back, the
  // record is quarantined.
  raw_exec(t.db(), "UPDATE executions SET out_artifact = 'sha256:" + std::string(64, '0') +
                       "' WHERE execution_id = 'ex-6'");
  auto again = open_ok(t);
  ASSERT_EQ(again->quarantined()->size(), 1U);
}

TEST(RegistryPublication, OutcomesFollowTheAccountingAndAreIdempotent) {
  TempDir t;
  auto reg = open_ok(t);
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("live", "act-live")));
  CUSTOS_EXPECT_ERRC(reg->record_publication("live", 0, published(1, digest_of("x"))),
                     Errc::registry_illegal_phase);
  terminal_with_output(*reg, "ex", 10, 0);
  CUSTOS_EXPECT_ERRC(reg->record_publication("ex", 0, published(9, digest_of("x"))),
                     Errc::accounting_invariant);
  CUSTOS_EXPECT_ERRC(
      reg->record_publication("ex", 0, StreamPublication{PublicationState::empty, 0, {}, {}}),
      Errc::accounting_invariant);
  CUSTOS_EXPECT_ERRC(
      reg->record_publication("ex", 1, StreamPublication{PublicationState::lost, 0, {}, "e"}),
      Errc::accounting_invariant);
  // failed, then retried: published. The same outcome again changes nothing; another is refused.
  CUSTOS_ASSERT_OK(reg->record_publication(
      "ex", 0, StreamPublication{PublicationState::failed, 0, {}, "artifact.no_space: disk full"}));
  auto failed = reg->get("ex");
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->out.publication, PublicationState::failed);
  EXPECT_FALSE(failed->out.publication_done);
  EXPECT_EQ(failed->out.publication_error, "artifact.no_space: disk full");
  CUSTOS_ASSERT_OK(reg->record_publication("ex", 0, published(10, digest_of("0123456789"))));
  CUSTOS_ASSERT_OK(reg->record_publication("ex", 0, published(10, digest_of("0123456789"))));
  CUSTOS_EXPECT_ERRC(reg->record_publication("ex", 0, published(10, digest_of("9876543210"))),
                     Errc::registry_illegal_phase);
  CUSTOS_EXPECT_ERRC(
      reg->record_publication("ex", 0, StreamPublication{PublicationState::failed, 0, {}, "x: y"}),
      Errc::registry_illegal_phase);
  auto rec = reg->get("ex");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->out.publication, PublicationState::published);
  EXPECT_TRUE(rec->out.publication_error.empty());
  EXPECT_EQ(rec->out.published_bytes, 10U);
  // One stream still pending: the execution is still listed as unpublished.
  auto todo = reg->unpublished("", 10);
  ASSERT_TRUE(todo);
  ASSERT_EQ(todo->size(), 1U);
  EXPECT_EQ(todo->front().execution_id, "ex");
}

TEST(ArtifactStore, TheNameIsTheDigestOfTheBytesAndTheSameBytesAreNotRewritten) {
  TempDir t;
  ArtifactStore store{t.state()};
  std::string bytes;
  for (int i = 0; i < 300000; ++i) bytes += static_cast<char>('a' + i % 26);
  auto const spool = spool_path(t.state(), "ex-1", "stdout");
  write_file(spool, bytes + "tail beyond the retained bytes");
  auto a = store.publish(spool, bytes.size());
  ASSERT_TRUE(a) << a.error().message();
  EXPECT_EQ(a->digest, digest_of(bytes));
  EXPECT_EQ(a->bytes, bytes.size());
  EXPECT_FALSE(a->existed);
  auto const path = store.path_of(a->digest);
  EXPECT_EQ(read_file(path), bytes) << "the artifact holds exactly the retained prefix";
  struct stat first {};
  ASSERT_EQ(::stat(path.c_str(), &first), 0);

  // The same bytes from another spool: the stored file stays (same inode), nothing in tmp.
  auto const other = spool_path(t.state(), "ex-2", "stderr");
  write_file(other, bytes);
  auto b = store.publish(other, bytes.size());
  ASSERT_TRUE(b) << b.error().message();
  EXPECT_TRUE(b->existed);
  EXPECT_EQ(b->digest, a->digest);
  struct stat second {};
  ASSERT_EQ(::stat(path.c_str(), &second), 0);
  EXPECT_EQ(first.st_ino, second.st_ino);
  EXPECT_TRUE(fs::is_empty(t.state() / "artifacts" / "tmp"));

  auto part = store.read(a->digest, 26, 4);
  ASSERT_TRUE(part);
  EXPECT_EQ(std::string(part->begin(), part->end()), "abcd");

  auto missing = store.publish(spool_path(t.state(), "ex-3", "stdout"), 5);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Errc::artifact_spool_missing);
  auto short_spool = store.publish(spool, bytes.size() + 1000);
  ASSERT_FALSE(short_spool);
  EXPECT_EQ(short_spool.error().code, Errc::artifact_spool_missing);

  fs::remove(path);
  auto gone = store.read(a->digest, 0, 4);
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().code, Errc::output_removed);
}

// publish copies, starts the write-back of and hashes a spool in 16 MiB slices: a spool over
// several slices, whose every 4 KiB block is different, must come out whole and in order, with
// the digest of exactly the retained prefix (which ends inside the last slice).
TEST(ArtifactStore, ASpoolOverSeveralSlicesIsCopiedAndHashedWhole) {
  TempDir t;
  ArtifactStore store{t.state()};
  std::size_t const retained = (std::size_t{33} << 20) + 4097;
  std::string bytes(retained, '\0');
  for (std::size_t i = 0; i < retained; ++i) {
    bytes[i] = static_cast<char>((i / 4096) * 31 + i % 251);
  }
  auto const spool = spool_path(t.state(), "ex-big", "stdout");
  write_file(spool, bytes + "tail beyond the retained bytes");
  auto a = store.publish(spool, retained);
  ASSERT_TRUE(a) << a.error().message();
  EXPECT_EQ(a->digest, digest_of(bytes));
  EXPECT_EQ(a->bytes, retained);
  EXPECT_FALSE(a->existed);
  EXPECT_TRUE(read_file(store.path_of(a->digest)) == bytes)
      << "the artifact holds exactly the retained prefix, in order";
  EXPECT_TRUE(fs::is_empty(t.state() / "artifacts" / "tmp"));
}

TEST(ArtifactStore, StoredOutputComesFromTheSpoolElseTheArtifact) {
  TempDir t;
  auto reg = open_ok(t);
  ArtifactStore store{t.state()};
  terminal_with_output(*reg, "ex", 11, 0, /*complete=*/false);
  auto const spool = spool_path(t.state(), "ex", "stdout");
  write_file(spool, "hello world");
  auto rec = reg->get("ex");
  ASSERT_TRUE(rec);
  auto s = read_stored_output(store, *rec, false, "stdout", 6, 100);
  ASSERT_TRUE(s) << s.error().message();
  EXPECT_EQ(std::string(s->data.begin(), s->data.end()), "world");
  EXPECT_TRUE(s->eof);
  EXPECT_FALSE(s->complete) << "truncated output stays incomplete";

  auto a = store.publish(spool, 11);
  ASSERT_TRUE(a);
  CUSTOS_ASSERT_OK(reg->record_publication("ex", 0, published(11, a->digest)));
  fs::remove(spool);
  rec = reg->get("ex");
  auto from_artifact = read_stored_output(store, *rec, false, "stdout", 0, 5);
  ASSERT_TRUE(from_artifact) << from_artifact.error().message();
  EXPECT_EQ(std::string(from_artifact->data.begin(), from_artifact->data.end()), "hello");
  EXPECT_FALSE(from_artifact->eof);
  auto empty = read_stored_output(store, *rec, false, "stderr", 0, 5);
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->data.empty());
  EXPECT_TRUE(empty->eof);
  auto no_pty = read_stored_output(store, *rec, false, "pty", 0, 5);
  ASSERT_FALSE(no_pty);
  EXPECT_EQ(no_pty.error().code, Errc::plan_invalid_value);
  fs::remove(store.path_of(a->digest));
  auto removed = read_stored_output(store, *rec, false, "stdout", 0, 5);
  ASSERT_FALSE(removed);
  EXPECT_EQ(removed.error().code, Errc::output_removed);
}

// The publisher records a publication, then removes the spool: a reader holding the record from
// before finds neither the spool nor (by its record) an artifact. The registry-aware read reads
// the record again and serves the artifact (CI saw exec.output fail right after exec.wait).
TEST(ArtifactStore, ASpoolPublishedAfterTheRecordWasReadIsServedFromTheArtifact) {
  TempDir t;
  auto reg = open_ok(t);
  ArtifactStore store{t.state()};
  terminal_with_output(*reg, "ex", 11, 0, /*complete=*/true);
  auto const spool = spool_path(t.state(), "ex", "stdout");
  write_file(spool, "hello world");
  auto const before = reg->get("ex");  // read before the publication
  ASSERT_TRUE(before);
  auto a = store.publish(spool, 11);
  ASSERT_TRUE(a);
  CUSTOS_ASSERT_OK(reg->record_publication("ex", 0, published(11, a->digest)));
  fs::remove(spool);

  auto stale = read_stored_output(store, *before, false, "stdout", 0, 100);
  ASSERT_FALSE(stale) << "the record alone cannot know the artifact";
  EXPECT_EQ(stale.error().code, Errc::artifact_spool_missing);
  auto s = read_stored_output(*reg, store, *before, false, "stdout", 0, 100);
  ASSERT_TRUE(s) << s.error().message();
  EXPECT_EQ(std::string(s->data.begin(), s->data.end()), "hello world");
  EXPECT_TRUE(s->eof);
  EXPECT_TRUE(s->complete);

  // A stream that really has neither stays an error after the second read.
  fs::remove(store.path_of(a->digest));
  terminal_with_output(*reg, "ex2", 5, 0, /*complete=*/true);
  auto const rec2 = reg->get("ex2");
  ASSERT_TRUE(rec2);
  auto missing = read_stored_output(*reg, store, *rec2, false, "stdout", 0, 100);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Errc::artifact_spool_missing);
}

void set_mtime(fs::path const& p, std::time_t when) {
  utimbuf b{when, when};
  ASSERT_EQ(::utime(p.c_str(), &b), 0);
}

TEST(Retention, RemovesOnlyWhatNothingNeedsAndTheOldestFirst) {
  TempDir t;
  auto reg = open_ok(t);
  ArtifactStore store{t.state()};
  std::time_t const now = std::time(nullptr);
  // Three published artifacts: 3 days, 2 days and 1 hour old, 1000 bytes each.
  std::vector<std::string> digests;
  for (int i = 0; i < 3; ++i) {
    auto const src = t.path() / ("src" + std::to_string(i));
    write_file(src, std::string(1000, static_cast<char>('a' + i)));
    auto a = store.publish(src, 1000);
    ASSERT_TRUE(a);
    digests.push_back(a->digest);
  }
  set_mtime(store.path_of(digests[0]), now - 3 * 86400);
  set_mtime(store.path_of(digests[1]), now - 2 * 86400);
  set_mtime(store.path_of(digests[2]), now - 3600);
  // Spools: a live execution's, a terminal one still to publish, a published one left behind,
  // an old one no record names, a recent one no record names.
  CUSTOS_ASSERT_OK(reg->record_authorized(make_execution("live", "act-live")));
  write_file(spool_path(t.state(), "live", "stdout"), std::string(500, 'l'));
  terminal_with_output(*reg, "todo", 300, 0);
  write_file(spool_path(t.state(), "todo", "stdout"), std::string(300, 't'));
  terminal_with_output(*reg, "done", 1000, 0);
  CUSTOS_ASSERT_OK(reg->record_publication("done", 0, published(1000, digests[2])));
  CUSTOS_ASSERT_OK(
      reg->record_publication("done", 1, StreamPublication{PublicationState::empty, 0, {}, {}}));
  write_file(spool_path(t.state(), "done", "stdout"), std::string(1000, 'c'));
  write_file(spool_path(t.state(), "stray-old", "stdout"), "x");
  set_mtime(spool_dir(t.state(), "stray-old"), now - 10 * 86400);
  write_file(spool_path(t.state(), "stray-new", "stdout"), "y");
  write_file(t.state() / "artifacts" / "tmp" / "interrupted", "half");

  // Age 1 day, no byte bound: the two old artifacts, the published spool, the old stray, tmp.
  auto r = sweep_output(*reg, store, RetentionPolicy{std::chrono::hours{24}, 0});
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->artifacts_removed, 2U);
  EXPECT_EQ(r->spools_removed, 2U);
  EXPECT_FALSE(fs::exists(store.path_of(digests[0])));
  EXPECT_FALSE(fs::exists(store.path_of(digests[1])));
  EXPECT_TRUE(fs::exists(store.path_of(digests[2])));
  EXPECT_TRUE(fs::exists(spool_dir(t.state(), "live")));
  EXPECT_TRUE(fs::exists(spool_dir(t.state(), "todo")));
  EXPECT_FALSE(fs::exists(spool_dir(t.state(), "done")));
  EXPECT_FALSE(fs::exists(spool_dir(t.state(), "stray-old")));
  EXPECT_TRUE(fs::exists(spool_dir(t.state(), "stray-new")));
  EXPECT_TRUE(fs::is_empty(t.state() / "artifacts" / "tmp"));
  EXPECT_EQ(r->figures.artifacts, 1U);
  EXPECT_EQ(r->figures.spool_executions, 3U);
  EXPECT_EQ(r->figures.spool_bytes, 500U + 300U + 1U);

  // A byte bound below what the spools alone hold: the last artifact goes, no spool does.
  auto bound = sweep_output(*reg, store, RetentionPolicy{std::chrono::seconds{0}, 100});
  ASSERT_TRUE(bound);
  EXPECT_EQ(bound->artifacts_removed, 1U);
  EXPECT_EQ(bound->spools_removed, 0U);
  EXPECT_TRUE(fs::exists(spool_dir(t.state(), "live")));
  EXPECT_TRUE(fs::exists(spool_dir(t.state(), "todo")));
  EXPECT_EQ(bound->figures.artifacts, 0U);
}

}  // namespace
}  // namespace custos::registry::test
