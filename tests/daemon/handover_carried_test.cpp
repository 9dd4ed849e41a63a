// The executions part of the handover manifest: what one image writes for a live execution is
// what the next one reads back, and every descriptor is checked before it is trusted — a pipe or
// a terminal for stdio, a connected stream socket for a backend's connection, and in each case
// still the file the manifest recorded.
#include "daemon/handover_carried.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace custos::daemon::handover {
namespace {

namespace json = boost::json;

// A manifest entry written and parsed back, as across an execve: the numbers stay open, and the
// reader owns them from there.
Result<supervisor::Carried> round_trip(supervisor::Carried c) {
  auto const text = json::serialize(carried_json(c));
  for (auto* fd : {&c.stdio.out, &c.stdio.err, &c.stdio.in, &c.stdio.connection}) {
    (void)fd->release();
  }
  return carried_from_json(json::parse(text));
}

supervisor::Carried with_connection(sys::UniqueFd fd) {
  supervisor::Carried c;
  c.execution_id = "ex-0123456789abcdef";
  c.stdio.connection = std::move(fd);
  c.stdio.state = json::object{{"exec", "abc"}, {"stream", json::object{{"remaining", 5}}}};
  return c;
}

TEST(HandoverCarried, AConnectionAndItsStateGoAcross) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  sys::UniqueFd peer{sv[1]};
  auto c = with_connection(sys::UniqueFd{sv[0]});
  int const number = c.stdio.connection.get();
  auto const j = carried_json(c);
  (void)c.stdio.connection.release();  // the manifest's reader owns the number from here
  auto back = carried_from_json(json::parse(json::serialize(j)));
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back->stdio.connection.get(), number);
  EXPECT_EQ(back->stdio.state, c.stdio.state);
  EXPECT_EQ(carried_fds(*back), std::vector<int>{number});
  // Still the same connection: what goes in one end comes out of the other.
  ASSERT_EQ(::write(peer.get(), "x", 1), 1);
  char b = 0;
  EXPECT_EQ(::read(back->stdio.connection.get(), &b, 1), 1);
  EXPECT_EQ(b, 'x');
}

TEST(HandoverCarried, AConnectionMustBeAConnectedStreamSocket) {
  // A pipe.
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  sys::UniqueFd keep{p[1]};
  auto r = round_trip(with_connection(sys::UniqueFd{p[0]}));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::daemon_handover_failed);
  EXPECT_NE(r.error().message().find("not a connected stream socket"), std::string::npos)
      << r.error().message();
  // A datagram socket.
  int d[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, d), 0);
  sys::UniqueFd keep_d{d[1]};
  EXPECT_FALSE(round_trip(with_connection(sys::UniqueFd{d[0]})));
  // A stream socket never connected.
  EXPECT_FALSE(
      round_trip(with_connection(sys::UniqueFd{::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)})));
  // A listening socket.
  sys::UniqueFd l{::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  ASSERT_TRUE(l.valid());
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::string const name = "custos-test-" + std::to_string(::getpid());
  std::copy(name.begin(), name.end(), a.sun_path + 1);  // abstract: nothing to unlink
  ASSERT_EQ(::bind(l.get(), reinterpret_cast<sockaddr const*>(&a),
                   static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())),
            0);
  ASSERT_EQ(::listen(l.get(), 1), 0);
  EXPECT_FALSE(round_trip(with_connection(std::move(l))));
}

TEST(HandoverCarried, ADescriptorThatIsNoLongerTheRecordedFileIsRefused) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  sys::UniqueFd peer{sv[1]};
  auto c = with_connection(sys::UniqueFd{sv[0]});
  auto j = carried_json(c);
  // The number now names another socket (as after a close and a reuse).
  int other[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, other), 0);
  sys::UniqueFd other_peer{other[1]};
  ASSERT_EQ(::dup3(other[0], c.stdio.connection.get(), O_CLOEXEC), c.stdio.connection.get());
  ::close(other[0]);
  (void)c.stdio.connection.release();
  auto r = carried_from_json(json::parse(json::serialize(j)));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("not the file the manifest recorded"), std::string::npos)
      << r.error().message();
}

TEST(HandoverCarried, StdioMustBeAPipeOrATerminal) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  sys::UniqueFd peer{sv[1]};
  supervisor::Carried c;
  c.execution_id = "ex-0123456789abcdef";
  c.stdio.out = sys::UniqueFd{sv[0]};  // a socket where a pipe belongs
  auto r = round_trip(std::move(c));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("neither a pipe nor a terminal"), std::string::npos)
      << r.error().message();
}

}  // namespace
}  // namespace custos::daemon::handover
