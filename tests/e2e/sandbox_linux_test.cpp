// The native backend's Linux enforcement of the sandbox, seen from inside the program
// (docs/sandbox.md, "Linux enforcement"): a real daemon launches real programs (python3 as a
// probe) under a plan's sandbox, and each test checks what the program could and could not do,
// and what the host saw.
#include <arpa/inet.h>
#include <netinet/in.h>

#include "custos/core/base64.hpp"

#include "harness.hpp"

namespace custos::e2e {
namespace {

constexpr std::uint32_t kNobody = 65534;

json::array rights(std::initializer_list<char const*> r) {
  json::array a;
  for (auto const* x : r) a.emplace_back(x);
  return a;
}

json::object rule(std::string const& path, std::initializer_list<char const*> r) {
  return json::object{{"path", path}, {"allow", rights(r)}};
}

// What python3 needs to start: /usr (read, execute) and the merged-/usr symlinks.
json::array system_rules() {
  return json::array{rule("/usr", {"discover", "metadata", "read", "execute"}),
                     rule("/bin", {"discover", "metadata", "read", "execute"}),
                     rule("/lib", {"discover", "metadata", "read", "execute"}),
                     rule("/lib64", {"discover", "metadata", "read", "execute"})};
}

class SandboxLinux : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "the sandbox's namespaces need a root daemon";
    ASSERT_TRUE(daemon_.ready()) << daemon_.log();
    auto info = daemon_.client().call(1, "host.info");
    ASSERT_TRUE(info && info->contains("result"));
    for (auto const& b : info->at("result").at("backends").as_array()) {
      if (b.at("kind").as_string() != "native") continue;
      for (auto const& c : b.at("controls").as_array()) {
        if (c.at("fidelity").as_string() == "hard") {
          hard_.emplace_back(c.at("name").as_string());
        }
      }
    }
    ws_ = work_.path() / "ws";
    fs::create_directories(ws_);
    ::chown(ws_.c_str(), kNobody, kNobody);
    // An admin's implicit authority runs as the caller only: running as nobody takes a runner
    // grant naming uid 65534 (docs/authority.md, "run_as").
    auto g = daemon_.client().call(
        2, "authority.grant",
        {{"id", "g-sandbox"},
         {"principal", "uid:" + std::to_string(::geteuid())},
         {"role", "runner"},
         {"operations", json::array{"exec.native"}},
         {"executables", json::array{json::object{{"path", "/usr/bin"}, {"prefix", true}},
                                     json::object{{"path", "/bin"}, {"prefix", true}}}},
         {"workspaces",
          json::array{json::object{
              {"workspace_id", "w1"}, {"root", ws_.native()}, {"max_access", "writable"}}}},
         {"environment_ids", json::array{"env1"}},
         {"resource_ids", json::array{"res1"}},
         {"run_as_uids", json::array{kNobody}},
         {"literal_env", true},
         {"budget", json::object{{"executions", 1000}}}});
    ASSERT_TRUE(g && g->contains("result")) << (g ? json::serialize(*g) : "no reply");
    epoch_ = g->at("result").at("epoch").as_int64();
  }

  bool hard(std::string const& control) const {
    return std::find(hard_.begin(), hard_.end(), control) != hard_.end();
  }

  // exec.start params running `argv` as nobody in the workspace under `sandbox`.
  json::object params(std::vector<std::string> const& argv, json::object sandbox,
                      json::array env = {}, bool writable = false) const {
    auto p = start_params(argv);
    auto& plan = p["plan"].as_object();
    plan["workspace"] =
        json::object{{"root", ws_.native()}, {"access", writable ? "writable" : "read_only"}};
    plan["user"] = json::object{{"uid", kNobody}, {"gid", kNobody}, {"groups", json::array{}}};
    plan["env"] = std::move(env);
    plan["sandbox"] = std::move(sandbox);
    json::value lease = nullptr;
    if (writable) {
      // A writable workspace is used under its lease (docs/authority.md).
      auto l = daemon_.client().call(3, "lease.acquire",
                                     {{"workspace_id", "w1"}, {"holder_session", "s1"}});
      EXPECT_TRUE(l && l->contains("result")) << (l ? json::serialize(*l) : "");
      if (l && l->contains("result")) lease = l->at("result").at("lease_id");
    }
    // A lease moves the authority epoch on: the request names the current one.
    std::int64_t epoch = epoch_;
    if (auto a = daemon_.client().call(4, "authority.list", json::object{});
        a && a->contains("result")) {
      epoch = a->at("result").at("epoch").as_int64();
    }
    p["authority"] = json::object{{"epoch", epoch}, {"grant_id", "g-sandbox"}, {"lease_id", lease}};
    return p;
  }

  // A sandbox with the system rules, the workspace (rights `ws`) and `extra` domains.
  json::object sandbox(std::initializer_list<char const*> ws, json::object extra = {}) const {
    json::array fsr = system_rules();
    fsr.push_back(rule(ws_.native(), ws));
    json::object sb = std::move(extra);
    if (!sb.contains("filesystem")) sb["filesystem"] = std::move(fsr);
    return sb;
  }

  struct Run {
    json::object terminal;
    std::string out;
    std::string err;
    std::string id;
  };

  // Starts, waits for the terminal result and reads both streams.
  Run run(json::object params) {
    Run r;
    auto c = daemon_.client();
    auto s = c.call(1, "exec.start", std::move(params));
    EXPECT_TRUE(s && s->contains("result")) << (s ? json::serialize(*s) : "no reply");
    if (!s || !s->contains("result")) return r;
    r.id = std::string{s->at("result").at("execution_id").as_string()};
    auto w = c.call(2, "exec.wait", {{"execution_id", r.id}, {"timeout_ms", 30000}});
    EXPECT_TRUE(w && w->contains("result")) << (w ? json::serialize(*w) : "");
    if (w && w->contains("result")) r.terminal = w->at("result").as_object();
    for (auto const* stream : {"stdout", "stderr"}) {
      auto o =
          c.call(3, "exec.output",
                 {{"execution_id", r.id}, {"stream", stream}, {"offset", 0}, {"max_bytes", 65536}});
      if (!o || !o->contains("result")) {
        // Said, not swallowed: a failed read is not an empty stream.
        r.err +=
            std::string{"exec.output "} + stream + ": " + (o ? json::serialize(*o) : "no reply");
        continue;
      }
      auto bytes = core::base64_decode(o->at("result").at("data_b64").as_string());
      std::string text(bytes ? bytes->begin() : std::vector<std::uint8_t>{}.begin(),
                       bytes ? bytes->end() : std::vector<std::uint8_t>{}.end());
      (std::string{stream} == "stdout" ? r.out : r.err) += text;
    }
    return r;
  }

  static std::vector<std::string> py(std::string const& code) {
    return {"/usr/bin/python3", "-I", "-S", "-c", code};
  }

  Daemon daemon_;
  TempDir work_;
  fs::path ws_;
  std::vector<std::string> hard_;
  std::int64_t epoch_ = 0;
};

// A TCP listener on 127.0.0.1 of the host, on a port the kernel picks.
class Listener {
 public:
  Listener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 16);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd_); }
  Listener(Listener const&) = delete;
  Listener& operator=(Listener const&) = delete;
  [[nodiscard]] int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST_F(SandboxLinux, ReadOutsideTheListedPathsFailsAndRevealsNothing) {
  ASSERT_TRUE(hard("filesystem.mount_namespace"));
  auto r = run(params(py("import os\n"
                         "try:\n"
                         "    print('root lists', sorted(os.listdir('/')))\n"
                         "except OSError as e: print('root list denied', e.errno)\n"
                         "for p in ['/etc/passwd', '/root', '/tmp', '/home', '/var/lib']:\n"
                         "    print(p, os.path.lexists(p))\n"
                         "try:\n"
                         "    open('/etc/hostname').read(); print('read')\n"
                         "except OSError as e: print('denied', e.errno)\n"
                         "print(os.getcwd())\n"),
                      sandbox({"discover", "metadata", "read"})));
  EXPECT_EQ(r.terminal.at("classification").as_string(), "exited")
      << json::serialize(r.terminal) << r.err;
  // The root holds only the mount points of the listed paths (and no directory of the host).
  EXPECT_NE(r.out.find("/etc/passwd False"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("/root False"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/home False"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/var/lib False"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("denied 2"), std::string::npos) << r.out;  // ENOENT: nothing revealed
  // The view's own root is not listed by any rule: Landlock refuses to list it.
  EXPECT_NE(r.out.find("root list denied 13"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(ws_.native()), std::string::npos) << r.out;
  EXPECT_EQ(r.terminal.at("tree").at("cleanup").as_string(), "confirmed");
}

TEST_F(SandboxLinux, WriteToAReadOnlyPathFailsAndChangesNothing) {
  {
    std::ofstream f(ws_ / "keep.txt");
    f << "original";
  }
  ::chown((ws_ / "keep.txt").c_str(), kNobody, kNobody);
  auto r = run(params(py("import os\n"
                         "for what, f in [('write', lambda: open('keep.txt', 'w').write('x')),\n"
                         "                ('create', lambda: open('new.txt', 'x').write('x')),\n"
                         "                ('remove', lambda: os.unlink('keep.txt')),\n"
                         "                ('mkdir', lambda: os.mkdir('d'))]:\n"
                         "    try:\n"
                         "        f(); print(what, 'done')\n"
                         "    except OSError as e: print(what, 'denied', e.errno)\n"),
                      sandbox({"discover", "metadata", "read"})));
  EXPECT_EQ(r.terminal.at("classification").as_string(), "exited") << r.err;
  for (auto const* what : {"write", "create", "remove", "mkdir"}) {
    EXPECT_NE(r.out.find(std::string{what} + " denied"), std::string::npos) << what << "\n"
                                                                            << r.out << r.err;
  }
  std::ifstream f(ws_ / "keep.txt");
  std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "original");
  EXPECT_FALSE(fs::exists(ws_ / "new.txt"));
  EXPECT_FALSE(fs::exists(ws_ / "d"));
}

TEST_F(SandboxLinux, AWritableWorkspaceIsWritableAndNothingElseIs) {
  auto r =
      run(params(py("import os\n"
                    "open('made.txt', 'w').write('hi'); print('made')\n"
                    "try:\n"
                    "    open('/usr/made.txt', 'w'); print('usr written')\n"
                    "except OSError as e: print('usr denied', e.errno)\n"),
                 sandbox({"discover", "metadata", "read", "create", "write", "remove"}), {}, true));
  EXPECT_NE(r.out.find("made"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("usr denied"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(ws_ / "made.txt"));
  EXPECT_FALSE(fs::exists("/usr/made.txt"));
}

TEST_F(SandboxLinux, ReadAndExecuteAreDistinctRights) {
  ASSERT_TRUE(hard("filesystem.landlock"));
  for (auto const* d : {"readable", "runnable", "execonly"}) {
    fs::create_directories(ws_ / d);
    fs::copy_file("/usr/bin/true", ws_ / d / "true");
  }
  json::array fsr = system_rules();
  fsr.push_back(rule(ws_.native(), {"metadata"}));
  fsr.push_back(rule((ws_ / "readable").native(), {"metadata", "read"}));
  fsr.push_back(rule((ws_ / "runnable").native(), {"metadata", "read", "execute"}));
  // Landlock treats execve as an open for reading: execute without read runs nothing (stricter
  // than asked, never looser) and reads nothing.
  fsr.push_back(rule((ws_ / "execonly").native(), {"metadata", "execute"}));
  auto r = run(
      params(py("import os, subprocess\n"
                "for d in ['readable', 'runnable', 'execonly']:\n"
                "    try:\n"
                "        print(d, 'ran', subprocess.run([d + '/true']).returncode)\n"
                "    except OSError as e: print(d, 'run denied', e.errno)\n"
                "    try:\n"
                "        open(d + '/true', 'rb').read(); print(d, 'read')\n"
                "    except OSError as e: print(d, 'read denied', e.errno)\n"
                "try:\n"
                "    os.listdir('runnable'); print('listed')\n"
                "except OSError as e: print('list denied', e.errno)\n"),
             json::object{{"filesystem", std::move(fsr)},
                          {"process", json::object{{"descendants", true}, {"max_processes", 8}}}}));
  EXPECT_NE(r.out.find("readable run denied 13"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("readable read"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("runnable ran 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("execonly run denied 13"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("execonly read denied 13"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("list denied 13"), std::string::npos) << r.out;  // no discover
}

TEST_F(SandboxLinux, AForkIsRefusedAndTheRunEndsSandboxDenied) {
  ASSERT_TRUE(hard("process.no_descendants"));
  auto r = run(params(py("import os, threading\n"
                         "t = threading.Thread(target=lambda: print('thread ran', flush=True))\n"
                         "t.start(); t.join()\n"
                         "os.fork()\n"
                         "print('forked')\n"),
                      sandbox({"discover", "metadata", "read"})));
  EXPECT_NE(r.out.find("thread ran"), std::string::npos) << r.out << r.err;
  EXPECT_EQ(r.out.find("forked"), std::string::npos) << r.out;
  EXPECT_EQ(r.terminal.at("classification").as_string(), "sandbox_denied")
      << json::serialize(r.terminal);
  EXPECT_EQ(r.terminal.at("exit").at("signal").as_int64(), SIGSYS);
  EXPECT_NE(json::serialize(r.terminal).find("process.no_descendants"), std::string::npos);
  EXPECT_EQ(r.terminal.at("tree").at("cleanup").as_string(), "confirmed");
}

TEST_F(SandboxLinux, MaxProcessesBoundsTheWholeTree) {
  ASSERT_TRUE(hard("process.max_processes"));
  auto r = run(params(py("import os, time\n"
                         "made = 0\n"
                         "for i in range(10):\n"
                         "    try:\n"
                         "        if os.fork() == 0:\n"
                         "            time.sleep(3); os._exit(0)\n"
                         "        made += 1\n"
                         "    except OSError as e:\n"
                         "        print('refused', e.errno); break\n"
                         "print('made', made)\n"),
                      sandbox({"discover", "metadata", "read"},
                              json::object{{"process", json::object{{"descendants", true},
                                                                    {"max_processes", 4}}}})));
  EXPECT_NE(r.out.find("refused 11"), std::string::npos) << r.out << r.err;  // EAGAIN
  EXPECT_NE(r.out.find("made 3"), std::string::npos) << r.out;
  EXPECT_EQ(r.terminal.at("tree").at("cleanup").as_string(), "confirmed");
}

TEST_F(SandboxLinux, TheTreeSeesOnlyItselfAndRunsAsNobody) {
  auto const daemon_pid = daemon_.pid();
  auto r = run(params(
      py("import os, ctypes\n"
         "print('pid', os.getpid(), 'uid', os.getuid())\n"
         "try:\n"
         "    os.kill(" +
         std::to_string(daemon_pid) +
         ", 0); print('seen')\n"
         "except OSError as e: print('kill', e.errno)\n"
         "print('procs', sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
         "libc = ctypes.CDLL(None, use_errno=True)\n"
         "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"),
      sandbox({"discover", "metadata", "read"},
              json::object{{"filesystem", [&] {
                              json::array f = system_rules();
                              f.push_back(rule(ws_.native(), {"discover", "metadata", "read"}));
                              f.push_back(rule("/proc", {"discover", "metadata", "read"}));
                              return f;
                            }()}})));
  EXPECT_NE(r.out.find("pid 1 uid 65534"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("kill 3"), std::string::npos) << r.out;  // ESRCH
  EXPECT_NE(r.out.find("procs ['1']"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("unshare -1 1"), std::string::npos) << r.out;  // EPERM: no user ns
}

TEST_F(SandboxLinux, TheEnvironmentIsExactlyThePlans) {
  json::array env{json::object{{"name", "LANG"}, {"value", "C.UTF-8"}}};
  auto r = run(
      params(py("import os\nprint(sorted(os.environ.items()))\n"),
             sandbox({"discover", "metadata", "read"},
                     json::object{{"environment", json::object{{"allow", json::array{"LANG"}}}}}),
             std::move(env)));
  EXPECT_NE(r.out.find("[('LANG', 'C.UTF-8')]"), std::string::npos) << r.out << r.err;
  EXPECT_EQ(r.out.find("CUSTOS_MARKER"), std::string::npos);
}

TEST_F(SandboxLinux, TcpConnectReachesOnlyTheListedPort) {
  ASSERT_TRUE(hard("network.tcp_connect"));
  Listener allowed;
  Listener other;
  std::string const code =
      "import socket\n"
      "for port in [" +
      std::to_string(allowed.port()) + ", " + std::to_string(other.port()) +
      "]:\n"
      "    s = socket.socket()\n"
      "    try:\n"
      "        s.connect(('127.0.0.1', port)); print(port, 'connected')\n"
      "    except OSError as e: print(port, 'refused', e.errno)\n"
      "for kind in [socket.SOCK_DGRAM, socket.SOCK_RAW]:\n"
      "    try:\n"
      "        socket.socket(socket.AF_INET, kind, 0 if kind == socket.SOCK_DGRAM else 1)\n"
      "        print(kind, 'opened')\n"
      "    except OSError as e: print(kind, 'refused', e.errno)\n"
      "s = socket.socket()\n"
      "try:\n"
      "    s.bind(('127.0.0.1', 0)); s.listen(); print('bound', s.getsockname()[1])\n"
      "except OSError as e: print('bind refused', e.errno)\n";
  auto r = run(params(
      py(code),
      sandbox({"discover", "metadata", "read"},
              json::object{
                  {"network",
                   json::object{{"outbound",
                                 json::object{{"tcp_connect", json::array{allowed.port()}}}}}}})));
  EXPECT_NE(r.out.find(std::to_string(allowed.port()) + " connected"), std::string::npos)
      << r.out << r.err;
  EXPECT_NE(r.out.find(std::to_string(other.port()) + " refused 13"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 refused 13"), std::string::npos) << r.out;  // UDP
  EXPECT_NE(r.out.find("3 refused 13"), std::string::npos) << r.out;  // raw
  EXPECT_NE(r.out.find("bind refused 13"), std::string::npos) << r.out;
}

TEST_F(SandboxLinux, OutboundAnyStillRefusesInbound) {
  ASSERT_TRUE(hard("network.no_inbound"));
  Listener host;
  auto r = run(params(py("import socket\n"
                         "s = socket.socket(); s.connect(('127.0.0.1', " +
                         std::to_string(host.port()) +
                         ")); print('connected')\n"
                         "for kind in [socket.SOCK_STREAM, socket.SOCK_DGRAM]:\n"
                         "    s = socket.socket(socket.AF_INET, kind)\n"
                         "    try:\n"
                         "        s.bind(('0.0.0.0', 0)); print(kind, 'bound')\n"
                         "    except OSError as e: print(kind, 'bind refused', e.errno)\n"),
                      sandbox({"discover", "metadata", "read"},
                              json::object{{"network", json::object{{"outbound", "any"}}}})));
  EXPECT_NE(r.out.find("connected"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("1 bind refused"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 bind refused"), std::string::npos) << r.out;
}

TEST_F(SandboxLinux, OutboundNoneHasOnlyAPrivateLoopback) {
  ASSERT_TRUE(hard("network.none"));
  Listener host;
  auto r = run(params(py("import socket, time\n"
                         "try:\n"
                         "    socket.create_connection(('127.0.0.1', " +
                         std::to_string(host.port()) +
                         "), 2); print('host reached')\n"
                         "except OSError as e: print('host unreachable', e.errno)\n"
                         "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
                         "c = socket.create_connection(s.getsockname(), 2)\n"
                         "print('own loopback', s.accept()[0] is not None)\n"
                         "print('interfaces', sorted(n for _, n in socket.if_nameindex()))\n"),
                      sandbox({"discover", "metadata", "read"})));
  EXPECT_NE(r.out.find("host unreachable"), std::string::npos)
      << r.out << r.err << json::serialize(r.terminal);
  EXPECT_NE(r.out.find("own loopback True"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("interfaces ['lo']"), std::string::npos) << r.out;
}

TEST_F(SandboxLinux, ANeedTheHostCannotMeetIsRefusedWithNoProcessAndTheActionUnused) {
  // On these hosts the cgroup v2 memory controller is absent: memory cannot be enforced.
  if (hard("resources.memory_bytes")) GTEST_SKIP() << "this host enforces memory_bytes";
  auto p = params(
      py("print('ran')"),
      sandbox({"discover", "metadata", "read"},
              json::object{{"resources", json::object{{"enforce", json::array{"memory_bytes"}}}}}));
  p["plan"].as_object()["limits"] = json::object{{"memory_bytes", 64 << 20}};
  auto c = daemon_.client();
  auto before = c.call(1, "exec.list", {{"limit", 100}});
  auto refused = c.call(2, "exec.start", p);
  ASSERT_TRUE(refused);
  EXPECT_EQ(error_code_of(*refused), "sandbox.unsupported") << json::serialize(*refused);
  EXPECT_NE(json::serialize(*refused).find("resources.memory_bytes"), std::string::npos);
  auto after = c.call(3, "exec.list", {{"limit", 100}});
  ASSERT_TRUE(before && after);
  EXPECT_EQ(json::serialize(before->at("result").at("executions")),
            json::serialize(after->at("result").at("executions")));
  // The same action id, without the need, starts: nothing was consumed.
  auto& plan = p["plan"].as_object();
  plan["sandbox"].as_object().erase("resources");
  auto r = run(std::move(p));
  EXPECT_EQ(r.terminal.at("classification").as_string(), "exited") << r.err;
  EXPECT_EQ(r.out, "ran\n");
}

TEST_F(SandboxLinux, CancellingASandboxedTreeEndsIt) {
  auto c = daemon_.client();
  auto s = c.call(1, "exec.start",
                  params(py("import os, time\n"
                            "for i in range(3):\n"
                            "    if os.fork() == 0:\n"
                            "        os.setsid(); time.sleep(60)\n"
                            "print('ready', flush=True); time.sleep(60)\n"),
                         sandbox({"discover", "metadata", "read"},
                                 json::object{{"process", json::object{{"descendants", true},
                                                                       {"max_processes", 8}}}})));
  ASSERT_TRUE(s && s->contains("result")) << (s ? json::serialize(*s) : "");
  std::string const id{s->at("result").at("execution_id").as_string()};
  ASSERT_TRUE(wait_record(
      c, id, [](json::object const& x) { return x.at("phase").as_string() == "running"; }));
  std::this_thread::sleep_for(300ms);
  auto x = c.call(2, "exec.cancel", {{"execution_id", id}});
  ASSERT_TRUE(x && x->contains("result")) << (x ? json::serialize(*x) : "");
  auto w = c.call(3, "exec.wait", {{"execution_id", id}, {"timeout_ms", 30000}});
  ASSERT_TRUE(w && w->contains("result"));
  auto const& t = w->at("result").as_object();
  EXPECT_EQ(t.at("classification").as_string(), "cancelled") << json::serialize(t);
  EXPECT_EQ(t.at("tree").at("cleanup").as_string(), "confirmed");
  // The record is bound to the sandbox it ran under.
  auto g = c.call(4, "exec.get", {{"execution_id", id}});
  ASSERT_TRUE(g && g->contains("result"));
  EXPECT_EQ(g->at("result").at("sandbox_digest").as_string().subview().substr(0, 7), "sha256:");
}

TEST_F(SandboxLinux, ASecretReachesOnlyItsChannelAndNothingElse) {
  std::string const value = "v4lue-" + unique_suffix();
  auto c = daemon_.client();
  for (auto const* name : {"tok-env", "tok-file", "tok-fd"}) {
    auto set = c.call(
        1, "secret.set",
        {{"name", name}, {"value_b64", core::base64_encode(std::string{name} + ":" + value)}});
    ASSERT_TRUE(set && set->contains("result")) << (set ? json::serialize(*set) : "");
  }
  json::array secrets{json::object{{"ref", "tok-env"}, {"to", json::object{{"env", "TOKEN"}}}},
                      json::object{{"ref", "tok-file"}, {"to", json::object{{"file", "token"}}}},
                      json::object{{"ref", "tok-fd"}, {"to", json::object{{"fd", 7}}}}};
  // The program prints each value reversed: its output is recorded, and must not hold a value.
  auto r = run(
      params(py("import os\n"
                "print('env', os.environ.get('TOKEN')[::-1])\n"
                "d = os.environ['CUSTOS_SECRETS_DIR']\n"
                "print('file', open(os.path.join(d, 'token')).read()[::-1])\n"
                "print('fd', os.read(7, 4096).decode()[::-1])\n"
                "print('names', sorted(os.environ))\n"),
             sandbox({"discover", "metadata", "read"},
                     json::object{{"secrets", std::move(secrets)},
                                  {"environment", json::object{{"allow", json::array{"LANG"}}}}}),
             json::array{json::object{{"name", "LANG"}, {"value", "C.UTF-8"}}}));
  EXPECT_EQ(r.terminal.at("classification").as_string(), "exited")
      << json::serialize(r.terminal) << r.err;
  auto reversed = [&](std::string x) {
    std::reverse(x.begin(), x.end());
    return x;
  };
  EXPECT_NE(r.out.find("env " + reversed("tok-env:" + value)), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("file " + reversed("tok-file:" + value)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fd " + reversed("tok-fd:" + value)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("names ['CUSTOS_SECRETS_DIR', 'LANG', 'TOKEN']"), std::string::npos)
      << r.out;
  EXPECT_EQ(json::serialize(r.terminal.at("exit")), R"({"code":0,"signal":null})") << r.err;
  // Nowhere else: not in the record, the events, the registry's files or the daemon's log.
  auto g = c.call(2, "exec.get", {{"execution_id", r.id}});
  ASSERT_TRUE(g);
  EXPECT_EQ(json::serialize(*g).find(value), std::string::npos);
  EXPECT_EQ(json::serialize(r.terminal).find(value), std::string::npos);
  EXPECT_EQ(daemon_.log().find(value), std::string::npos);
  for (auto const& e : fs::recursive_directory_iterator(daemon_.state())) {
    if (!e.is_regular_file() || e.path().parent_path().filename() == "secrets") continue;
    std::ifstream f(e.path(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(bytes.find(value), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace custos::e2e
