// The memory a staged child runs in until execve (ChildArena, a small pool of them) and the
// plan laid out in it before clone3 (see spawn.hpp).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <linux/filter.h>
#include <mutex>
#include <net/if.h>
#include <new>
#include <sys/mman.h>
#include <sys/mount.h>
#include <vector>

#include "spawn_internal.hpp"

namespace custos::sys::detail {
namespace {

// ---- the child's arena -------------------------------------------------------------------
//
// One mapping per staged child: [guard page][stack][plan data]. The stack grows down from the
// start of the plan data towards the PROT_NONE guard page, so an overflow faults instead of
// overwriting memory. Arenas of the standard size are kept in a small pool, so a launch costs
// no mmap/mprotect/munmap (and no TLB shootdown of the daemon's other threads) in the steady
// state; a plan whose argv/envp do not fit gets a mapping of its own.
constexpr std::size_t kPage = 4096;
constexpr std::size_t kChildStack = std::size_t{60} * 1024;
constexpr std::size_t kStandardData = std::size_t{64} * 1024;
constexpr std::size_t kStandardArena = kPage + kChildStack + kStandardData;
constexpr std::size_t kArenaPoolMax = 8;

struct ArenaPool {
  std::mutex mu;
  std::vector<void*> free;
};

ArenaPool& arena_pool() {
  static ArenaPool* const pool = new ArenaPool();  // never destroyed: children may outlive main
  return *pool;
}

// detail::arena_stats.
std::atomic<std::size_t> g_arenas_mapped{0};
std::atomic<std::size_t> g_arena_mmaps{0};

Result<ChildArena> make_arena(std::size_t data_bytes) {
  std::size_t const data =
      data_bytes <= kStandardData ? kStandardData : (data_bytes + kPage - 1) / kPage * kPage;
  std::size_t const size = kPage + kChildStack + data;
  if (size == kStandardArena) {
    std::lock_guard const lock(arena_pool().mu);
    auto& free = arena_pool().free;
    if (!free.empty()) {
      void* const base = free.back();
      free.pop_back();
      return ChildArena(base, size);
    }
  }
  void* const base =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (base == MAP_FAILED) return Error(Errc::sys_error, "mmap of the child's stack", errno);
  if (::mprotect(base, kPage, PROT_NONE) != 0) {
    int const err = errno;
    ::munmap(base, size);
    return Error(Errc::sys_error, "mprotect of the child's guard page", err);
  }
  g_arenas_mapped.fetch_add(1, std::memory_order_relaxed);
  g_arena_mmaps.fetch_add(1, std::memory_order_relaxed);
  return ChildArena(base, size);
}

// Bump allocation of the plan data inside the arena.
class ArenaWriter {
 public:
  ArenaWriter(char* begin, char* end) noexcept : p_(begin), end_(end) {}
  template <typename T>
  T* take(std::size_t count) noexcept {
    auto const addr = reinterpret_cast<std::uintptr_t>(p_);
    std::uintptr_t const aligned = (addr + alignof(T) - 1) & ~(std::uintptr_t{alignof(T)} - 1);
    p_ = reinterpret_cast<char*>(aligned + sizeof(T) * count);
    return reinterpret_cast<T*>(aligned);
  }
  char* copy(std::string const& s) noexcept {
    char* const out = take<char>(s.size() + 1);
    std::memcpy(out, s.data(), s.size());
    out[s.size()] = '\0';
    return out;
  }
  char** pointers(std::vector<std::string> const& strings) noexcept {
    char** const out = take<char*>(strings.size() + 1);
    for (std::size_t i = 0; i < strings.size(); ++i) out[i] = copy(strings[i]);
    out[strings.size()] = nullptr;
    return out;
  }
  [[nodiscard]] bool overflowed() const noexcept { return p_ > end_; }

 private:
  char* p_;
  char* end_;
};

// The sandbox's part of the plan (SpawnSandbox): the descriptors to place, the view's attaches
// and procfs mounts with their targets copied into the arena, the loopback's ifreq, the /proc
// Landlock rule, and the seccomp program.
void write_sandbox(SpawnSandbox const& sb, PlanFds const& fds, ArenaWriter& w, ChildPlan& plan) {
  if (!fds.fd_maps.empty()) {
    FdMapping* const maps = w.take<FdMapping>(fds.fd_maps.size());
    std::copy(fds.fd_maps.begin(), fds.fd_maps.end(), maps);
    plan.fd_maps = maps;
    plan.fd_map_count = fds.fd_maps.size();
  }
  plan.pids_procs_fd = fds.pids_procs;
  if (sb.view != nullptr) {
    plan.new_mount_ns = true;
    plan.view_root_fd = fds.view_root;
    ViewAttach* const attaches = w.take<ViewAttach>(fds.attaches.size() + 1);
    for (std::size_t i = 0; i < fds.attaches.size(); ++i) {
      attaches[i] = ViewAttach{fds.attaches[i].fd, w.copy(std::string{fds.attaches[i].target})};
    }
    plan.attaches = attaches;
    plan.attach_count = fds.attaches.size();
    auto const& procs = sb.view->procs();
    ViewProc* const p = w.take<ViewProc>(procs.size() + 1);
    for (std::size_t i = 0; i < procs.size(); ++i) {
      p[i] = ViewProc{w.copy(procs[i].target),
                      static_cast<unsigned long>(MS_NOSUID | MS_NODEV | MS_NOEXEC) |
                          (procs[i].read_only ? static_cast<unsigned long>(MS_RDONLY) : 0UL)};
    }
    plan.procs = p;
    plan.proc_count = procs.size();
    plan.view_cwd = w.copy(sb.cwd.empty() ? std::string{"/"} : sb.cwd);
  }
  if (sb.new_net_namespace) {
    auto* const ifr = new (w.take<struct ifreq>(1)) ifreq{};
    std::memcpy(ifr->ifr_name, "lo", 3);
    plan.loopback_ifreq = ifr;
  }
  plan.drop_capabilities = sb.drop_capabilities;
  plan.no_new_privs = sb.no_new_privs;
  plan.landlock_fd = fds.landlock;
  if (fds.landlock >= 0 && sb.proc_landlock_access != 0 && plan.proc_count > 0) {
    plan.proc_landlock =
        new (w.take<LandlockPathAttr>(1)) LandlockPathAttr{sb.proc_landlock_access, -1};
  }
  if (!sb.seccomp.empty()) {
    auto* const insns = w.take<BpfInsn>(sb.seccomp.size());
    std::copy(sb.seccomp.begin(), sb.seccomp.end(), insns);
    auto* const prog = new (w.take<struct sock_fprog>(1)) sock_fprog{};
    prog->len = static_cast<unsigned short>(sb.seccomp.size());
    prog->filter = reinterpret_cast<sock_filter*>(insns);
    plan.seccomp_fprog = prog;
  }
}

// Bytes of plan data spawn_staged writes for `spec` (an upper bound: every item padded).
std::size_t plan_bytes(SpawnSpec const& spec) {
  std::size_t n = sizeof(ChildPlan) + 64;
  n += spec.executable.size() + 1;
  for (auto const& a : spec.argv) n += a.size() + 1;
  for (auto const& e : spec.envp) n += e.size() + 1;
  n += (spec.argv.size() + spec.envp.size() + 2) * sizeof(char*) + 16;
  n += spec.rlimits.size() * sizeof(Rlimit) + 16;
  if (spec.credentials) n += spec.credentials->groups.size() * sizeof(gid_t) + 16;
  n += 8 * sizeof(int) + 16;  // the kept descriptors without a sandbox
  if (auto const& sb = spec.sandbox) {
    n += sb->cwd.size() + 1 + sizeof(struct ifreq) + 16;
    n += (sb->fds.size() + 1) * (sizeof(FdMapping) + 2 * sizeof(int)) + 16;
    n += sizeof(struct sock_fprog) + sb->seccomp.size() * sizeof(BpfInsn) + 16;
    n += sizeof(LandlockPathAttr) + 16;
    if (sb->view != nullptr) {
      for (auto const& a : sb->view->attaches()) n += a.target.size() + 1 + sizeof(ViewAttach) + 16;
      for (auto const& p : sb->view->procs()) n += p.target.size() + 1 + sizeof(ViewProc) + 16;
      n += (sb->view->attaches().size() + 4) * sizeof(int) + 16;
    }
  }
  return n;
}

}  // namespace

ChildArena::ChildArena(ChildArena&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), size_(std::exchange(other.size_, 0)) {}

ChildArena& ChildArena::operator=(ChildArena&& other) noexcept {
  if (this != &other) {
    reset();
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

ChildArena::~ChildArena() {
  reset();
}

void ChildArena::reset() noexcept {
  if (base_ == nullptr) return;
  void* const base = std::exchange(base_, nullptr);
  std::size_t const size = std::exchange(size_, 0);
  if (size == kStandardArena) {
    std::lock_guard const lock(arena_pool().mu);
    auto& free = arena_pool().free;
    if (free.size() < kArenaPoolMax) {
      free.push_back(base);
      return;
    }
  }
  ::munmap(base, size);
  g_arenas_mapped.fetch_sub(1, std::memory_order_relaxed);
}

ArenaStats arena_stats() noexcept {
  std::size_t pooled = 0;
  {
    std::lock_guard const lock(arena_pool().mu);
    pooled = arena_pool().free.size();
  }
  return ArenaStats{g_arenas_mapped.load(std::memory_order_relaxed),
                    g_arena_mmaps.load(std::memory_order_relaxed), pooled};
}

void ChildArena::leak() noexcept {
  base_ = nullptr;
  size_ = 0;
}

Result<ChildArena> make_child_arena(SpawnSpec const& spec) {
  return make_arena(plan_bytes(spec));
}

// Lays the plan out in the arena: argv/envp, stdio, the descriptors kept past close_range,
// limits and credentials. Nothing here can fail but the bound, which plan_bytes() guarantees.
Result<ChildLayout> write_plan(SpawnSpec const& spec, ChildArena& arena, PlanFds const& fds) {
  char* const arena_base = static_cast<char*>(arena.base());
  char* const stack_low = arena_base + kPage;
  ArenaWriter w(stack_low + kChildStack, arena_base + arena.size());
  ChildPlan* const plan = new (w.take<ChildPlan>(1)) ChildPlan();
  plan->path = w.copy(spec.executable);
  plan->argv = w.pointers(spec.argv);
  plan->envp = w.pointers(spec.envp);
  if (spec.pty_slave_fd >= 0) {
    for (int& fd : plan->stdio) fd = spec.pty_slave_fd;
    if (spec.controlling_tty) plan->ctty_fd = spec.pty_slave_fd;
  } else {
    plan->stdio[0] = spec.stdin_fd >= 0 ? spec.stdin_fd : fds.devnull;
    plan->stdio[1] = spec.stdout_fd >= 0 ? spec.stdout_fd : fds.devnull;
    plan->stdio[2] = spec.stderr_fd >= 0 ? spec.stderr_fd : fds.devnull;
  }
  plan->new_session = spec.new_session;
  {
    std::vector<int> keep = fds.sandbox_keep;
    keep.push_back(fds.channel);
    if (fds.cwd >= 0) keep.push_back(fds.cwd);
    std::sort(keep.begin(), keep.end());
    keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
    int* const k = w.take<int>(keep.size());
    std::copy(keep.begin(), keep.end(), k);
    plan->keep = k;
    plan->keep_count = keep.size();
  }
  if (!spec.rlimits.empty()) {
    Rlimit* const limits = w.take<Rlimit>(spec.rlimits.size());
    std::copy(spec.rlimits.begin(), spec.rlimits.end(), limits);
    plan->rlimits = limits;
  }
  plan->rlimit_count = spec.rlimits.size();
  if (spec.credentials) {
    plan->set_credentials = true;
    plan->uid = spec.credentials->uid;
    plan->gid = spec.credentials->gid;
    auto const& groups = spec.credentials->groups;
    gid_t* const g = w.take<gid_t>(std::max<std::size_t>(groups.size(), 1));
    std::copy(groups.begin(), groups.end(), g);
    plan->groups = g;
    plan->group_count = groups.size();
  }
  plan->cwd_fd = fds.cwd;
  if (spec.sandbox) write_sandbox(*spec.sandbox, fds, w, *plan);
  plan->barrier_fd = fds.channel;
  plan->error_fd = fds.channel;
  if (w.overflowed()) {
    // plan_bytes() is an upper bound of what the writer takes; this cannot happen.
    return Error(Errc::sys_error, "spawn plan larger than its arena", EOVERFLOW);
  }
  return ChildLayout{plan, stack_low, kChildStack};
}

}  // namespace custos::sys::detail
