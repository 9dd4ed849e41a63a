#include "custos/sys/mount_view.hpp"

#include <climits>

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace custos::sys {
namespace {

// The mount API's flags, spelled here so the build does not depend on which linux/mount.h the
// libc's sys/mount.h can be included with (they conflict before glibc 2.37).
constexpr unsigned kFsopenCloexec = 0x00000001;
constexpr unsigned kFsconfigSetString = 1;
constexpr unsigned kFsconfigCmdCreate = 6;
constexpr unsigned kFsmountCloexec = 0x00000001;
constexpr unsigned kOpenTreeClone = 1;
constexpr unsigned kOpenTreeCloexec = O_CLOEXEC;
constexpr std::uint64_t kAttrRdonly = 0x00000001;
constexpr std::uint64_t kAttrNosuid = 0x00000002;
constexpr std::uint64_t kAttrNodev = 0x00000004;
constexpr std::uint64_t kAttrNoexec = 0x00000008;

struct MountAttr {
  std::uint64_t attr_set;
  std::uint64_t attr_clr;
  std::uint64_t propagation;
  std::uint64_t userns_fd;
};

Error sys_error(std::string what, std::string const& path, int err) {
  if (err == ENOSYS) return Error(Errc::sys_unsupported, what + " (no mount API)", err);
  return Error(Errc::sys_error, what + " " + path, err);
}

Result<void> set_attrs(int fd, std::uint64_t attrs, bool recursive, std::string const& path) {
  MountAttr a{attrs, 0, 0, 0};
  unsigned const flags = AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0U);
  if (::syscall(SYS_mount_setattr, fd, "", flags, &a, sizeof a) != 0) {
    return sys_error("mount_setattr", path, errno);
  }
  return ok();
}

// A new detached tmpfs: nosuid, nodev, noexec, its root `mode` and owner.
Result<UniqueFd> make_tmpfs(std::string const& path, char const* mode, std::uint32_t uid = 0,
                            std::uint32_t gid = 0) {
  UniqueFd ctx(static_cast<int>(::syscall(SYS_fsopen, "tmpfs", kFsopenCloexec)));
  if (!ctx.valid()) return sys_error("fsopen tmpfs for", path, errno);
  std::string const uid_s = std::to_string(uid);
  std::string const gid_s = std::to_string(gid);
  for (auto const& [key, value] : {std::pair<char const*, char const*>{"mode", mode},
                                   {"size", "1m"},
                                   {"nr_inodes", "4096"},
                                   {"uid", uid_s.c_str()},
                                   {"gid", gid_s.c_str()}}) {
    if (::syscall(SYS_fsconfig, ctx.get(), kFsconfigSetString, key, value, 0) != 0) {
      return sys_error(std::string{"fsconfig "} + key + " of the tmpfs for", path, errno);
    }
  }
  if (::syscall(SYS_fsconfig, ctx.get(), kFsconfigCmdCreate, nullptr, nullptr, 0) != 0) {
    return sys_error("creating the tmpfs for", path, errno);
  }
  UniqueFd mnt(static_cast<int>(
      ::syscall(SYS_fsmount, ctx.get(), kFsmountCloexec, kAttrNosuid | kAttrNodev | kAttrNoexec)));
  if (!mnt.valid()) return sys_error("fsmount of the tmpfs for", path, errno);
  return mnt;
}

bool valid_path(std::string const& p) {
  if (p.empty() || p.front() != '/' || p.size() >= PATH_MAX) return false;
  if (p == "/") return true;
  if (p.back() == '/' || p.find('\0') != std::string::npos) return false;
  std::size_t i = 1;
  while (i <= p.size()) {
    std::size_t const j = std::min(p.find('/', i), p.size());
    std::string_view const c(p.data() + i, j - i);
    if (c.empty() || c == "." || c == "..") return false;
    i = j + 1;
  }
  return true;
}

bool at_or_below(std::string_view path, std::string_view ancestor) {
  if (ancestor == "/") return true;
  return path.size() >= ancestor.size() && path.compare(0, ancestor.size(), ancestor) == 0 &&
         (path.size() == ancestor.size() || path[ancestor.size()] == '/');
}

// The path of `p` below `ancestor` ("" when equal), without a leading '/'.
std::string below(std::string const& p, std::string const& ancestor) {
  if (p.size() == ancestor.size()) return {};
  std::size_t const skip = ancestor == "/" ? 1 : ancestor.size() + 1;
  return p.substr(skip);
}

// A place in the view the daemon can still write into: the root tmpfs or an attached tmpfs.
struct Layer {
  std::string prefix;
  int fd;  // the tmpfs's root (owned by the view)
};

// A directory made in a layer gets 0755 whatever the daemon's umask (0077): the view's
// directories above a listed path are what a non-root program walks through to reach it.
int make_dir(int dirfd, char const* name) {
  if (::mkdirat(dirfd, name, 0755) != 0) return -1;
  return ::fchmodat(dirfd, name, 0755, 0);
}

// Creates `rel` (a relative path, components separated by '/') inside the layer: every
// directory above it, then the last component as a directory, an empty file, or a symlink to
// `link_target`. An existing entry of the right type is fine (two paths may share ancestors).
enum class Leaf : std::uint8_t { directory, file, symlink };
Result<void> make_in_layer(Layer const& layer, std::string const& rel, Leaf leaf,
                           std::string const& link_target, std::string const& path) {
  if (rel.empty()) return ok();
  UniqueFd dir(::fcntl(layer.fd, F_DUPFD_CLOEXEC, 3));
  if (!dir.valid()) return sys_error("dup of the view's layer for", path, errno);
  std::size_t i = 0;
  for (;;) {
    std::size_t const slash = rel.find('/', i);
    std::string const comp = rel.substr(i, slash == std::string::npos ? rel.npos : slash - i);
    if (slash == std::string::npos) {
      int r = 0;
      if (leaf == Leaf::directory) {
        r = make_dir(dir.get(), comp.c_str());
      } else if (leaf == Leaf::symlink) {
        r = ::symlinkat(link_target.c_str(), dir.get(), comp.c_str());
      } else {
        int const fd = ::openat(dir.get(), comp.c_str(),
                                O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0644);
        r = fd < 0 ? -1 : ::close(fd);
      }
      if (r != 0 && errno != EEXIST) return sys_error("creating the mount point", path, errno);
      return ok();
    }
    if (make_dir(dir.get(), comp.c_str()) != 0 && errno != EEXIST) {
      return sys_error("creating a directory above", path, errno);
    }
    UniqueFd next(::openat(dir.get(), comp.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next.valid()) return sys_error("opening a directory above", path, errno);
    dir = std::move(next);
    i = slash + 1;
  }
}

// The host's parent directory of `path`, resolved without following any symlink; nullopt-like
// empty fd when it does not exist.
Result<UniqueFd> open_parent(std::string const& path) {
  std::size_t const slash = path.rfind('/');
  std::string const parent = slash == 0 ? "/" : path.substr(0, slash);
  open_how how{};
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  for (;;) {
    long const fd = ::syscall(SYS_openat2, AT_FDCWD, parent.c_str(), &how, sizeof how);
    if (fd >= 0) return UniqueFd(static_cast<int>(fd));
    int const err = errno;
    if (err == EINTR || err == EAGAIN) continue;
    if (err == ENOENT || err == ENOTDIR) return UniqueFd();
    if (err == ELOOP) {
      return Error(Errc::workspace_escape,
                   "a directory above " + path +
                       " is a symlink on this host: list the path it "
                       "resolves to",
                   err);
    }
    return sys_error("opening the directory above", path, err);
  }
}

}  // namespace

Result<PrivateView> PrivateView::overlay(std::vector<ViewPath> const& paths) {
  PrivateView view;
  for (auto const& p : paths) {
    if (p.kind != ViewPath::Kind::visible || !valid_path(p.path) || p.path == "/") {
      return Error(Errc::plan_invalid_value, "not a path an overlay can lay: " + p.path, EINVAL);
    }
    UniqueFd parent = CUSTOS_TRY(open_parent(p.path));
    std::string const name = p.path.substr(p.path.rfind('/') + 1);
    UniqueFd entry;
    if (parent.valid()) {
      entry.reset(::openat(parent.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    }
    if (!entry.valid()) return sys_error("open", p.path, parent.valid() ? errno : ENOENT);
    UniqueFd clone(static_cast<int>(
        ::syscall(SYS_open_tree, entry.get(), "",
                  kOpenTreeClone | kOpenTreeCloexec | AT_RECURSIVE | AT_EMPTY_PATH)));
    if (!clone.valid()) return sys_error("open_tree (clone)", p.path, errno);
    std::uint64_t attrs = 0;
    if (p.read_only) attrs |= kAttrRdonly;
    if (p.no_exec) attrs |= kAttrNoexec;
    if (!p.devices) attrs |= kAttrNodev;
    if (attrs != 0) CUSTOS_TRYV(set_attrs(clone.get(), attrs, true, p.path));
    view.attaches_.push_back(Attach{std::move(clone), p.path});
  }
  return view;
}

bool mount_api_available() noexcept {
  static bool const available = [] {
    long const fd = ::syscall(SYS_fsopen, "tmpfs", kFsopenCloexec);
    if (fd >= 0) {
      ::close(static_cast<int>(fd));
      return true;
    }
    return errno != ENOSYS;
  }();
  return available;
}

// NOLINTNEXTLINE(readability-function-cognitive-complexity): one pass over the sorted paths
Result<PrivateView> PrivateView::build(std::vector<ViewPath> paths, ViewFiles const* files) {
  for (auto const& p : paths) {
    if (!valid_path(p.path)) {
      return Error(Errc::plan_invalid_value, "view path is not absolute and normalized: " + p.path,
                   EINVAL);
    }
    if (p.kind == ViewPath::Kind::proc ? p.path != "/proc"
                                       : p.path != "/proc" && at_or_below(p.path, "/proc")) {
      return Error(Errc::plan_invalid_value,
                   "below /proc only a fresh procfs at /proc itself can be shown: " + p.path,
                   EINVAL);
    }
  }
  std::sort(paths.begin(), paths.end(),
            [](ViewPath const& a, ViewPath const& b) { return a.path < b.path; });

  PrivateView view;
  std::vector<UniqueFd> layer_fds;  // every tmpfs made read-only at the end
  std::vector<Layer> layers;
  // What each processed path turned out to be, for the nearest-ancestor question.
  enum class Was : std::uint8_t { visible, layer, transparent };
  std::vector<std::pair<std::string, Was>> done;

  bool const root_visible =
      !paths.empty() && paths.front().path == "/" && paths.front().kind == ViewPath::Kind::visible;
  if (!root_visible) {
    view.root_ = CUSTOS_TRY(make_tmpfs("/", "0755"));
    layers.push_back(Layer{"/", view.root_.get()});
  }

  for (auto const& p : paths) {
    // The nearest processed ancestor that materialized: a visible clone, or a tmpfs layer.
    Was above = Was::layer;
    Layer const* layer = layers.empty() ? nullptr : &layers.front();
    for (auto it = done.rbegin(); it != done.rend(); ++it) {
      if (it->second == Was::transparent || !at_or_below(p.path, it->first)) continue;
      above = it->second;
      if (above == Was::layer) {
        auto const l = std::find_if(layers.begin(), layers.end(),
                                    [&](Layer const& x) { return x.prefix == it->first; });
        layer = &*l;
      }
      break;
    }

    if (p.kind == ViewPath::Kind::proc) {
      if (above == Was::layer)
        CUSTOS_TRYV(
            make_in_layer(*layer, below(p.path, layer->prefix), Leaf::directory, {}, p.path));
      view.procs_.push_back(Proc{p.path, p.read_only});
      done.emplace_back(p.path, Was::transparent);
      continue;
    }

    // The host's entry at this path, reached without following a symlink.
    UniqueFd entry;
    struct stat st {};
    if (p.path == "/") {
      entry.reset(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!entry.valid() || ::fstat(entry.get(), &st) != 0) return sys_error("open", "/", errno);
    } else {
      UniqueFd parent = CUSTOS_TRY(open_parent(p.path));
      std::string const name = p.path.substr(p.path.rfind('/') + 1);
      if (!parent.valid() || ::fstatat(parent.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (parent.valid() && errno != ENOENT) return sys_error("stat", p.path, errno);
        done.emplace_back(p.path, Was::transparent);  // absent on the host: absent here too
        continue;
      }
      if (S_ISLNK(st.st_mode)) {
        if (above == Was::layer) {
          std::string target(PATH_MAX, '\0');
          ssize_t const n = ::readlinkat(parent.get(), name.c_str(), target.data(), target.size());
          if (n < 0) return sys_error("readlink", p.path, errno);
          target.resize(static_cast<std::size_t>(n));
          CUSTOS_TRYV(
              make_in_layer(*layer, below(p.path, layer->prefix), Leaf::symlink, target, p.path));
        }
        done.emplace_back(p.path, Was::transparent);
        continue;
      }
      entry.reset(::openat(parent.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
      if (!entry.valid()) return sys_error("open", p.path, errno);
    }
    bool const directory = S_ISDIR(st.st_mode);

    if (p.kind == ViewPath::Kind::hidden) {
      if (above != Was::visible) {
        done.emplace_back(p.path, Was::transparent);  // nothing above it shows it anyway
        continue;
      }
      if (!directory) {
        return Error(Errc::plan_invalid_value,
                     "only a directory can be hidden below a visible path: " + p.path, EINVAL);
      }
      UniqueFd tmp = CUSTOS_TRY(make_tmpfs(p.path, "0755"));
      layers.push_back(Layer{p.path, tmp.get()});
      auto dup = CUSTOS_TRY(tmp.dup());
      layer_fds.push_back(std::move(tmp));
      view.attaches_.push_back(Attach{std::move(dup), p.path});
      done.emplace_back(p.path, Was::layer);
      continue;
    }

    UniqueFd clone(static_cast<int>(
        ::syscall(SYS_open_tree, entry.get(), "",
                  kOpenTreeClone | kOpenTreeCloexec | AT_RECURSIVE | AT_EMPTY_PATH)));
    if (!clone.valid()) return sys_error("open_tree (clone)", p.path, errno);
    std::uint64_t attrs = kAttrNosuid;
    if (p.read_only) attrs |= kAttrRdonly;
    if (p.no_exec) attrs |= kAttrNoexec;
    if (!p.devices) attrs |= kAttrNodev;
    CUSTOS_TRYV(set_attrs(clone.get(), attrs, true, p.path));
    if (p.path == "/") {
      view.root_ = std::move(clone);
    } else {
      if (above == Was::layer) {
        CUSTOS_TRYV(make_in_layer(*layer, below(p.path, layer->prefix),
                                  directory ? Leaf::directory : Leaf::file, {}, p.path));
      }
      view.attaches_.push_back(Attach{std::move(clone), p.path});
    }
    view.opened_.push_back(Opened{p.path, std::move(entry), directory});
    done.emplace_back(p.path, Was::visible);
  }

  if (files != nullptr) {
    if (!valid_path(files->path) || files->path == "/") {
      return Error(Errc::plan_invalid_value, "files path is not a place: " + files->path, EINVAL);
    }
    Layer const* layer = nullptr;
    for (auto it = done.rbegin(); it != done.rend(); ++it) {
      if (it->second == Was::transparent || !at_or_below(files->path, it->first)) continue;
      if (it->second == Was::visible) {
        return Error(Errc::plan_invalid_value,
                     files->path + " lies under " + it->first + ", which the view shows", EINVAL);
      }
      layer = &*std::find_if(layers.begin(), layers.end(),
                             [&](Layer const& x) { return x.prefix == it->first; });
      break;
    }
    if (layer == nullptr && root_visible) {
      return Error(Errc::plan_invalid_value, files->path + " lies under /, which the view shows",
                   EINVAL);
    }
    if (layer == nullptr) layer = &layers.front();
    CUSTOS_TRYV(
        make_in_layer(*layer, below(files->path, layer->prefix), Leaf::directory, {}, files->path));
    UniqueFd dir = CUSTOS_TRY(make_tmpfs(files->path, "0500", files->uid, files->gid));
    for (auto const& f : files->files) {
      if (f.name.empty() || f.name == "." || f.name == ".." ||
          f.name.find('/') != std::string::npos) {
        return Error(Errc::plan_invalid_value, "a file name is one path component", EINVAL);
      }
      UniqueFd out(::openat(dir.get(), f.name.c_str(),
                            O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0400));
      if (!out.valid()) return sys_error("creating the file", files->path + "/" + f.name, errno);
      std::size_t off = 0;
      while (off < f.bytes.size()) {
        ssize_t const n = ::write(out.get(), f.bytes.data() + off, f.bytes.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return sys_error("writing the file", files->path + "/" + f.name, errno);
        off += static_cast<std::size_t>(n);
      }
      if (::fchown(out.get(), files->uid, files->gid) != 0) {
        return sys_error("chown of the file", files->path + "/" + f.name, errno);
      }
    }
    CUSTOS_TRYV(set_attrs(dir.get(), kAttrRdonly | kAttrNosuid | kAttrNodev | kAttrNoexec, false,
                          files->path));
    view.attaches_.push_back(Attach{std::move(dir), files->path});
  }

  // Nothing more is created in the tmpfs layers: they become read-only, so the program cannot
  // make entries where the view has only mount points.
  if (!root_visible) CUSTOS_TRYV(set_attrs(view.root_.get(), kAttrRdonly, false, "/"));
  for (auto const& l : layer_fds) CUSTOS_TRYV(set_attrs(l.get(), kAttrRdonly, false, "(hidden)"));
  return view;
}

}  // namespace custos::sys
