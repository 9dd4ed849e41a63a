// The "facility absent" paths, exercised for real: a forked child loads a seccomp filter that
// makes clone3, pidfd_open and openat2 fail with ENOSYS (as on an old kernel or under a container
// runtime's filter) and checks that each becomes a clean sys.unsupported.
#include <seccomp.h>

#include <sys/wait.h>
#include <unistd.h>

#include "custos/sys/openat2.hpp"
#include "custos/sys/pidfd.hpp"
#include "custos/sys/spawn.hpp"

#include "sys/process_fixture.hpp"
#include "sys/process_util.hpp"

namespace custos::sys {
namespace {

using testing::FdLeakTest;
using testing::simple_spec;

class SpawnEnosysTest : public FdLeakTest {};

// Runs in the forked child; the exit code is a bitmask of failed checks (0 = all good).
int check_enosys_paths() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return 64;
  int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(pidfd_open), 0);
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(openat2), 0);
  rc |= seccomp_load(ctx);
  seccomp_release(ctx);
  if (rc != 0) return 65;

  int failed = 0;
  auto staged = spawn_staged(simple_spec("/bin/true", {"true"}));
  if (staged || staged.error().code != Errc::sys_unsupported) failed |= 1;
  auto pfd = Pidfd::open(static_cast<std::int32_t>(::getpid()));
  if (pfd || pfd.error().code != Errc::sys_unsupported) failed |= 2;
  auto root = open_directory("/");
  if (!root) return 66;
  auto beneath = open_beneath(*root, "tmp", true);
  if (beneath || beneath.error().code != Errc::sys_unsupported) failed |= 4;
  return failed;
}

TEST_F(SpawnEnosysTest, MissingFacilitiesAreSysUnsupported) {
  pid_t const pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ::_exit(check_enosys_paths());
  auto pfd = Pidfd::open(pid);
  ASSERT_TRUE(pfd);
  auto st = pfd->wait();
  ASSERT_TRUE(st);
  EXPECT_EQ(*st, ExitStatus::exited(0)) << "bitmask: 1 clone3, 2 pidfd_open, 4 openat2, 64+ setup";
}

}  // namespace
}  // namespace custos::sys
