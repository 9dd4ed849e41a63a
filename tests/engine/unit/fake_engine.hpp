// A scripted stand-in for an engine on a real Unix socket: for the client's deadlines, limits
// and malformed answers, which real engines do not produce on demand. Each accepted connection
// gets its request read (header and Content-Length body) and is then handed to the script on
// the server's own thread.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <sys/socket.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace custos::engine::testing {

class FakeEngine {
 public:
  // script(fd, request): answer on fd (the server closes fd afterwards).
  using Script = std::function<void(int fd, std::string const& request)>;

  // `accept`: false leaves connections in the listen backlog (connect works, nothing answers).
  explicit FakeEngine(Script script, bool accept = true) : script_(std::move(script)) {
    char tmpl[] = "/tmp/custos-fake-engine-XXXXXX";
    char* d = ::mkdtemp(tmpl);
    EXPECT_NE(d, nullptr);
    dir_ = d != nullptr ? d : "/tmp";
    path_ = dir_ + "/engine.sock";
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(listen_fd_, 64), 0);
    if (accept) thread_ = std::thread([this] { serve(); });
  }

  FakeEngine(FakeEngine const&) = delete;
  FakeEngine& operator=(FakeEngine const&) = delete;

  ~FakeEngine() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    {
      std::lock_guard const lock(mu_);
      for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
    }
    if (thread_.joinable()) thread_.join();
    for (auto& t : workers_) t.join();
    ::close(listen_fd_);
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }

  [[nodiscard]] std::string const& path() const { return path_; }

  [[nodiscard]] std::vector<std::string> requests() const {
    std::lock_guard const lock(mu_);
    return requests_;
  }
  [[nodiscard]] int connections() const { return connections_.load(); }

  // Blocks until the peer has closed the connection or shut down its writing half: true when
  // read() gives 0 within `ms`.
  static bool peer_closed_within(int fd, int ms) {
    auto const until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    char buf[4096];
    timeval tv{0, 20000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (std::chrono::steady_clock::now() < until) {
      ssize_t const n = ::read(fd, buf, sizeof buf);
      if (n == 0) return true;
      if (n < 0 && errno != EAGAIN && errno != EINTR) return true;
    }
    return false;
  }

  static bool send_all(int fd, std::string_view data) {
    while (!data.empty()) {
      ssize_t const n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

 private:
  void serve() {
    while (!stop_) {
      int const fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      ++connections_;
      std::lock_guard const lock(mu_);
      open_.push_back(fd);
      workers_.emplace_back([this, fd] {
        auto const req = read_request(fd);
        {
          std::lock_guard const l(mu_);
          requests_.push_back(req);
        }
        script_(fd, req);
        ::close(fd);
        std::lock_guard const l(mu_);
        std::erase(open_, fd);
      });
    }
  }

  static std::string read_request(int fd) {
    std::string req;
    char buf[4096];
    while (req.find("\r\n\r\n") == std::string::npos) {
      ssize_t const n = ::read(fd, buf, sizeof buf);
      if (n <= 0) return req;
      req.append(buf, static_cast<std::size_t>(n));
    }
    auto const head_end = req.find("\r\n\r\n") + 4;
    std::size_t length = 0;
    auto const cl = req.find("Content-Length: ");
    if (cl != std::string::npos && cl < head_end)
      length = std::strtoul(req.c_str() + cl + 16, nullptr, 10);
    while (req.size() < head_end + length) {
      ssize_t const n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      req.append(buf, static_cast<std::size_t>(n));
    }
    return req;
  }

  Script script_;
  std::string dir_;
  std::string path_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
  mutable std::mutex mu_;
  std::vector<std::thread> workers_;
  std::vector<int> open_;
  std::vector<std::string> requests_;
};

// A canned answer with a Content-Length.
inline std::string answer(int status, std::string_view reason, std::string_view body,
                          std::string_view extra_headers = {}) {
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string{reason} +
         "\r\nContent-Type: application/json\r\n" + std::string{extra_headers} +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string{body};
}

inline constexpr std::string_view kVersionBody =
    R"({"Version":"99.0","ApiVersion":"1.41","MinAPIVersion":"1.12","Os":"linux"})";

}  // namespace custos::engine::testing
