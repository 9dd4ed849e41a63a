// A private filesystem view, prepared by the daemon with the mount API and entered by a staged
// child (docs/sandbox.md, "Linux enforcement").
//
// The daemon builds, before clone3 and with ordinary error handling:
//   * a detached tmpfs that becomes the child's root: read-only, empty but for the directories,
//     files and symlinks the listed paths need as their mount points;
//   * for every visible path a detached clone of the host's mount tree at that path
//     (open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)), resolved without following any symlink, with
//     its attributes set (read-only, noexec, nosuid, nodev) on the whole clone;
//   * for a hidden path below a visible one, an empty read-only tmpfs to lay over it;
//   * optionally a small tmpfs of files (the secrets directory).
// The child, in a new mount namespace, only attaches: it makes its copy of the daemon's mounts
// private, moves the root onto "/", pivots into it and detaches the old root, then moves each
// clone onto its place and mounts a fresh procfs where the view has /proc. Detached mounts made
// in the daemon's namespace may be attached in the child's (the mount API's documented use), and
// every path the child names resolves inside the new root, so nothing it does can reach the
// host's tree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::sys {

// One path of the view, absolute and normalized (no "..", no empty or "." component).
struct ViewPath {
  enum class Kind : std::uint8_t {
    visible,  // the host's tree at this path (its submounts included), with the flags below
    hidden,   // nothing below this path exists, though an ancestor is visible
    proc,     // a fresh procfs of the child's PID namespace (path must be /proc)
  };
  std::string path;
  Kind kind = Kind::visible;
  bool read_only = true;
  bool no_exec = true;
  bool devices = false;  // device nodes usable (nodev otherwise)
};

// A file of a files tmpfs (the secrets directory): created 0400, owned by uid:gid.
struct ViewFile {
  std::string name;  // one path component
  std::string bytes;
};

struct ViewFiles {
  std::string path;  // where it appears, absolute; must lie under no visible path
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::vector<ViewFile> files;
};

// What a child does to enter the view, in order: attach `root` on "/", pivot into it, then for
// each attach move `fd` onto `target` (an absolute path inside the new root), then mount a
// procfs on each of `procs`.
class PrivateView {
 public:
  struct Attach {
    UniqueFd fd;         // a detached mount (a clone of the host's tree, or a tmpfs)
    std::string target;  // absolute, inside the view
  };
  struct Proc {
    std::string target;
    bool read_only = true;
  };

  // Builds the view of `paths` (any order; ancestors are laid down before what lies below
  // them). A listed path that does not exist on the host is left out (it does not exist in the
  // view either). A listed path that is itself a symlink appears as the same symlink (its
  // target text), governed by whatever the view holds where it points.
  // Errors: plan.invalid_value for a path that is not absolute and normalized, a hidden path
  // that is not a directory, a proc path other than /proc, a path below /proc, or files whose
  // place lies under a visible path; workspace.escape (ELOOP) when a component above a listed
  // path is a symlink on the host (the rule would name a place other than the one it spells);
  // sys.unsupported without the mount API (ENOSYS); sys.error for every other failure, with
  // errno and the path.
  [[nodiscard]] static Result<PrivateView> build(std::vector<ViewPath> paths,
                                                 ViewFiles const* files = nullptr);

  // The host's own tree with `paths` (visible ones only) laid over themselves with their flags:
  // no private root, no pivot. What an unsandboxed execution's read-only workspace is: the same
  // directory, read-only for the execution. Errors as build's.
  [[nodiscard]] static Result<PrivateView> overlay(std::vector<ViewPath> const& paths);

  // Invalid for an overlay: the child keeps the host's root.
  [[nodiscard]] UniqueFd const& root() const noexcept { return root_; }
  [[nodiscard]] std::vector<Attach> const& attaches() const noexcept { return attaches_; }
  [[nodiscard]] std::vector<Proc> const& procs() const noexcept { return procs_; }
  // For each visible path that exists and is not a symlink: an O_PATH descriptor of it as the
  // view shows it (the same inode), e.g. for Landlock rules, with its path.
  struct Opened {
    std::string path;
    UniqueFd fd;
    bool directory = false;
  };
  [[nodiscard]] std::vector<Opened> const& opened() const noexcept { return opened_; }

 private:
  UniqueFd root_;
  std::vector<Attach> attaches_;
  std::vector<Proc> procs_;
  std::vector<Opened> opened_;
};

// Whether this kernel has the mount API the view needs (fsopen, fsmount, open_tree,
// move_mount, mount_setattr). Probed once.
[[nodiscard]] bool mount_api_available() noexcept;

}  // namespace custos::sys
