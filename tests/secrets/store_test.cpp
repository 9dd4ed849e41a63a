// The secret store on real directories under $TMPDIR: modes and owners read back with stat,
// atomic replacement seen through the inode, the credentials directory as a second source, and
// concurrent callers.
#include "custos/secrets/store.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "custos/sandbox/types.hpp"

namespace custos::secrets {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "custos-secrets-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    if (p == nullptr) std::abort();
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(TempDir const&) = delete;
  TempDir& operator=(TempDir const&) = delete;
  [[nodiscard]] fs::path const& path() const { return path_; }

 private:
  fs::path path_;
};

std::span<std::uint8_t const> bytes(std::string_view s) {
  return {reinterpret_cast<std::uint8_t const*>(s.data()), s.size()};
}

std::string text(SecretValue const& v) {
  return {reinterpret_cast<char const*>(v.bytes().data()), v.size()};
}

struct stat stat_of(fs::path const& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st;
}

unsigned mode_of(fs::path const& p) {
  return stat_of(p).st_mode & 07777;
}

void write_file(fs::path const& p, std::string_view content, unsigned mode) {
  std::ofstream(p, std::ios::binary) << content;
  ASSERT_EQ(::chmod(p.c_str(), mode), 0);
}

std::vector<std::string> dir_names(fs::path const& dir) {
  std::vector<std::string> out;
  for (auto const& e : fs::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

class SecretStoreTest : public ::testing::Test {
 protected:
  [[nodiscard]] fs::path dir() const { return tmp_.path() / "secrets"; }
  [[nodiscard]] fs::path creds() const { return tmp_.path() / "credentials"; }

  std::unique_ptr<SecretStore> open_ok(bool with_credentials = false) {
    auto r = SecretStore::open({dir(), with_credentials ? creds() : fs::path{}});
    EXPECT_TRUE(r) << (r ? "" : r.error().message());
    return r ? std::move(*r) : nullptr;
  }

  Errc open_error() {
    auto r = SecretStore::open({dir(), {}});
    EXPECT_FALSE(r);
    return r ? Errc::internal : r.error().code;
  }

  TempDir tmp_;
};

TEST_F(SecretStoreTest, OpenCreatesARootOnlyDirectory) {
  auto store = open_ok();
  ASSERT_TRUE(store);
  auto const st = stat_of(dir());
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700U);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_TRUE(dir_names(dir()).empty());
}

TEST_F(SecretStoreTest, ModesAreExactWhateverTheUmask) {
  mode_t const old = ::umask(0277);  // would make 0700 → 0500 and 0600 → 0400
  auto store = open_ok();
  auto const set = store ? store->set("db-password", bytes("hunter2")) : Result<void>{};
  ::umask(old);
  ASSERT_TRUE(store);
  ASSERT_TRUE(set) << set.error().message();
  EXPECT_EQ(mode_of(dir()), 0700U);
  EXPECT_EQ(mode_of(dir() / "db-password"), 0600U);
}

TEST_F(SecretStoreTest, SetStoresExactlyTheBytesIn0600File) {
  auto store = open_ok();
  ASSERT_TRUE(store);
  std::string const value("line one\n\0binary\xff\n", 18);
  ASSERT_TRUE(store->set("tls.key_1", bytes(value)));
  auto const st = stat_of(dir() / "tls.key_1");
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600U);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), value.size());
  auto v = store->read("tls.key_1");
  ASSERT_TRUE(v) << v.error().message();
  EXPECT_EQ(text(*v), value) << "no trailing newline stripped, NUL kept";
  EXPECT_TRUE(store->contains("tls.key_1"));
  EXPECT_FALSE(store->contains("tls.key_2"));
}

TEST_F(SecretStoreTest, SetReplacesByRenameAndLeavesNoTemporary) {
  auto store = open_ok();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->set("token", bytes("first value")));
  auto const before = stat_of(dir() / "token").st_ino;
  ASSERT_TRUE(store->set("token", bytes("second")));
  // A new inode under the name: the old file was never rewritten in place, so a reader holding
  // it (or a crash mid-write) sees one whole value or the other.
  EXPECT_NE(stat_of(dir() / "token").st_ino, before);
  EXPECT_EQ(dir_names(dir()), std::vector<std::string>{"token"});
  auto v = store->read("token");
  ASSERT_TRUE(v);
  EXPECT_EQ(text(*v), "second");
}

TEST_F(SecretStoreTest, AnInterruptedSetKeepsTheOldValueAndItsTemporaryIsSweptAtOpen) {
  {
    auto store = open_ok();
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->set("token", bytes("old")));
  }
  // What a crash between create and rename leaves: a half-written temporary.
  write_file(dir() / ".set-token", "ne", 0600);
  auto store = open_ok();
  ASSERT_TRUE(store);
  EXPECT_EQ(dir_names(dir()), std::vector<std::string>{"token"});
  auto v = store->read("token");
  ASSERT_TRUE(v);
  EXPECT_EQ(text(*v), "old");
}

TEST_F(SecretStoreTest, ListGivesSortedNamesAndTheirMtime) {
  auto store = open_ok();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->set("zeta", bytes("1")));
  ASSERT_TRUE(store->set("Alpha", bytes("2")));
  ASSERT_TRUE(store->set("mid.dle", bytes("")));  // an empty value is a value
  auto l = store->list();
  ASSERT_TRUE(l) << l.error().message();
  ASSERT_EQ(l->size(), 3U);
  EXPECT_EQ((*l)[0].name, "Alpha");
  EXPECT_EQ((*l)[1].name, "mid.dle");
  EXPECT_EQ((*l)[2].name, "zeta");
  for (auto const& e : *l) {
    auto const st = stat_of(dir() / e.name);
    EXPECT_EQ(e.created_ns, st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec);
    EXPECT_GT(e.created_ns, 0);
    EXPECT_EQ(e.source, SecretSource::store);
  }
  auto empty = store->read("mid.dle");
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->empty());
}

TEST_F(SecretStoreTest, RemoveDeletesAndAnUnknownNameIsSecretUnknown) {
  auto store = open_ok();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->set("gone", bytes("x")));
  ASSERT_TRUE(store->remove("gone"));
  EXPECT_FALSE(fs::exists(dir() / "gone"));
  EXPECT_FALSE(store->contains("gone"));
  auto again = store->remove("gone");
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, Errc::sandbox_secret_unknown);
  auto r = store->read("gone");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::sandbox_secret_unknown);
}

TEST_F(SecretStoreTest, BadNamesAreRefusedByEveryMethod) {
  auto store = open_ok();
  ASSERT_TRUE(store);
  std::string const longest(sandbox::kMaxSecretRefBytes, 'a');
  EXPECT_TRUE(store->set(longest, bytes("v")));
  for (std::string const& bad :
       {std::string{}, std::string{".hidden"}, std::string{"-dash"}, std::string{"_under"},
        std::string{"a/b"}, std::string{"../up"}, std::string{"sp ace"}, std::string{"\xc3\xa4"},
        std::string{".set-x"}, longest + "a", std::string("nul\0x", 5)}) {
    auto s = store->set(bad, bytes("v"));
    ASSERT_FALSE(s) << bad;
    EXPECT_EQ(s.error().code, Errc::secret_invalid_name) << bad;
    auto d = store->remove(bad);
    ASSERT_FALSE(d);
    EXPECT_EQ(d.error().code, Errc::secret_invalid_name);
    auto r = store->read(bad);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, Errc::secret_invalid_name);
    EXPECT_FALSE(store->contains(bad));
  }
  EXPECT_EQ(dir_names(dir()), std::vector<std::string>{longest});
}

TEST_F(SecretStoreTest, AValueBeyondTheBoundIsTooLargeAndNothingIsWritten) {
  auto store = open_ok();
  ASSERT_TRUE(store);
  std::string const max(kMaxSecretValueBytes, 'k');
  EXPECT_TRUE(store->set("max", bytes(max)));
  std::string const over(kMaxSecretValueBytes + 1, 'k');
  auto r = store->set("over", bytes(over));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::secret_too_large);
  EXPECT_EQ(r.error().message().find("kkkk"), std::string::npos) << "the error names, never shows";
  EXPECT_NE(r.error().message().find("over"), std::string::npos);
  EXPECT_EQ(dir_names(dir()), std::vector<std::string>{"max"});
}

TEST_F(SecretStoreTest, AWiderDirectoryModeIsRefusedNotRepaired) {
  ASSERT_EQ(::mkdir(dir().c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir().c_str(), 0755), 0);
  EXPECT_EQ(open_error(), Errc::secret_store_unsafe);
  EXPECT_EQ(mode_of(dir()), 0755U) << "the operator decides; the daemon does not chmod";
  ASSERT_EQ(::chmod(dir().c_str(), 0500), 0);  // narrower is wrong too: the daemon must write
  EXPECT_EQ(open_error(), Errc::secret_store_unsafe);
}

TEST_F(SecretStoreTest, AForeignOwnerIsRefused) {
  ASSERT_EQ(::mkdir(dir().c_str(), 0700), 0);
  if (::chown(dir().c_str(), 65534, 65534) != 0) GTEST_SKIP() << "chown needs CAP_CHOWN";
  EXPECT_EQ(open_error(), Errc::secret_store_unsafe);
}

TEST_F(SecretStoreTest, ASymlinkedDirectoryIsRefused) {
  fs::path const real = tmp_.path() / "elsewhere";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  fs::create_directory_symlink(real, dir());
  EXPECT_EQ(open_error(), Errc::secret_store_unsafe);
}

TEST_F(SecretStoreTest, AnEntryBreakingTheRulesRefusesTheStoreAtOpen) {
  struct Case {
    char const* what;
    void (*plant)(fs::path const&);
  };
  Case const cases[] = {
      {"a 0644 file", [](fs::path const& d) { write_file(d / "wide", "v", 0644); }},
      {"a 0400 file", [](fs::path const& d) { write_file(d / "narrow", "v", 0400); }},
      {"an invalid name", [](fs::path const& d) { write_file(d / "bad name", "v", 0600); }},
      {"a directory", [](fs::path const& d) { ASSERT_EQ(::mkdir((d / "sub").c_str(), 0700), 0); }},
      {"a symlink", [](fs::path const& d) { fs::create_symlink("/etc/hostname", d / "link"); }},
      {"a second link",
       [](fs::path const& d) {
         write_file(d / "one", "v", 0600);
         fs::create_hard_link(d / "one", d.parent_path() / "outside");
       }},
  };
  for (auto const& c : cases) {
    SCOPED_TRACE(c.what);
    std::error_code ec;
    fs::remove_all(dir(), ec);
    fs::remove(tmp_.path() / "outside", ec);
    ASSERT_EQ(::mkdir(dir().c_str(), 0700), 0);
    c.plant(dir());
    EXPECT_EQ(open_error(), Errc::secret_store_unsafe);
  }
}

TEST_F(SecretStoreTest, AFileChangedAfterOpenIsRefusedWhenMet) {
  auto store = open_ok();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->set("token", bytes("v")));
  ASSERT_EQ(::chmod((dir() / "token").c_str(), 0644), 0);
  auto r = store->read("token");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::secret_store_unsafe);
  auto l = store->list();
  ASSERT_FALSE(l);
  EXPECT_EQ(l.error().code, Errc::secret_store_unsafe);
  // A FIFO planted under a name must not hang read(): refused.
  ASSERT_EQ(::mkfifo((dir() / "fifo").c_str(), 0600), 0);
  auto f = store->read("fifo");
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().code, Errc::secret_store_unsafe);
}

TEST_F(SecretStoreTest, CredentialsAreASecondReadOnlySourceTheStoreShadows) {
  ASSERT_EQ(::mkdir(creds().c_str(), 0500), 0);
  write_file(creds() / "api-token", "from systemd", 0400);
  write_file(creds() / "not a ref", "ignored", 0400);
  ASSERT_EQ(::mkdir((creds() / "subdir").c_str(), 0500), 0);
  auto store = open_ok(/*with_credentials=*/true);
  ASSERT_TRUE(store);

  EXPECT_TRUE(store->contains("api-token"));
  EXPECT_FALSE(store->contains("subdir"));
  auto v = store->read("api-token");
  ASSERT_TRUE(v) << v.error().message();
  EXPECT_EQ(text(*v), "from systemd");
  auto l = store->list();
  ASSERT_TRUE(l);
  ASSERT_EQ(l->size(), 1U);
  EXPECT_EQ((*l)[0].name, "api-token");
  EXPECT_EQ((*l)[0].source, SecretSource::credentials);

  auto d = store->remove("api-token");
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, Errc::secret_read_only);
  EXPECT_TRUE(fs::exists(creds() / "api-token"));

  // The store's own value wins while it exists; deleting it serves the credential again.
  ASSERT_TRUE(store->set("api-token", bytes("rotated")));
  v = store->read("api-token");
  ASSERT_TRUE(v);
  EXPECT_EQ(text(*v), "rotated");
  l = store->list();
  ASSERT_TRUE(l);
  ASSERT_EQ(l->size(), 1U);
  EXPECT_EQ((*l)[0].source, SecretSource::store);
  ASSERT_TRUE(store->remove("api-token"));
  v = store->read("api-token");
  ASSERT_TRUE(v);
  EXPECT_EQ(text(*v), "from systemd");
}

TEST_F(SecretStoreTest, ACredentialBeyondTheBoundIsTooLargeWhenRead) {
  ASSERT_EQ(::mkdir(creds().c_str(), 0700), 0);
  write_file(creds() / "huge", std::string(kMaxSecretValueBytes + 1, 'h'), 0400);
  auto store = open_ok(/*with_credentials=*/true);
  ASSERT_TRUE(store);
  auto r = store->read("huge");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::secret_too_large);
}

TEST_F(SecretStoreTest, AMissingCredentialsDirectoryIsAnErrorAtOpen) {
  auto r = SecretStore::open({dir(), creds()});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::sys_error);
  EXPECT_EQ(r.error().sys_errno, ENOENT);
}

// The gateway asks contains() on the loop and on its authorizer thread while secret.set and
// secret.delete run: every answer is one of the states the writer moves between.
TEST_F(SecretStoreTest, ConcurrentCallersSeeWholeValues) {
  auto store = open_ok();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->set("steady", bytes("AAAA")));
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        if (!store->contains("steady")) ++bad;
        auto v = store->read("steady");
        if (!v || (text(*v) != "AAAA" && text(*v) != "BBBBBBBB")) ++bad;
        static_cast<void>(store->contains("flicker"));
      }
    });
  }
  for (int i = 0; i < 60; ++i) {
    EXPECT_TRUE(store->set("steady", bytes(i % 2 == 0 ? "BBBBBBBB" : "AAAA")));
    EXPECT_TRUE(store->set("flicker", bytes("x")));
    EXPECT_TRUE(store->remove("flicker"));
  }
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(SecretValue, MovesLeaveNothingBehind) {
  auto a = SecretValue::copy_of(bytes("s3cr3t"));
  EXPECT_EQ(text(a), "s3cr3t");
  SecretValue b = std::move(a);
  EXPECT_EQ(a.size(), 0U);  // NOLINT(bugprone-use-after-move): the moved-from state is the point
  EXPECT_EQ(text(b), "s3cr3t");
  b = SecretValue::copy_of(bytes("x"));
  EXPECT_EQ(text(b), "x");
  auto z = SecretValue::zeroed(4);
  EXPECT_EQ(text(z), std::string(4, '\0'));
  EXPECT_NE(SecretValue::zeroed(0).bytes().data(), nullptr);
}

TEST(SecretValue, WipeBytesZeroes) {
  std::string buf = "value";
  wipe_bytes(buf.data(), buf.size());
  EXPECT_EQ(buf, std::string(5, '\0'));
}

}  // namespace
}  // namespace custos::secrets
