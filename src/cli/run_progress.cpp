#include "run_progress.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <unistd.h>

namespace custos::cli {

namespace json = boost::json;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kRedraw{250};
constexpr milliseconds kSample{1000};

std::string human_bytes(std::uint64_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  static constexpr char const* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n) / 1024.0;
  std::size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, kUnits[u]);
}

}  // namespace

ProgressLine::ProgressLine(bool asked)
    : enabled_(asked && ::isatty(STDERR_FILENO) == 1), started_(Clock::now()) {}

int ProgressLine::wait_ms(Clock::time_point now) const {
  if (!enabled_) return -1;
  auto const next = last_draw_ + kRedraw;
  if (next <= now) return 0;
  return static_cast<int>(std::chrono::duration_cast<milliseconds>(next - now).count()) + 1;
}

bool ProgressLine::sample_due(Clock::time_point now) const {
  return enabled_ && !inflight_ && now - last_sample_ >= kSample;
}

void ProgressLine::sample_sent(std::uint64_t request_id, Clock::time_point now) {
  inflight_ = request_id;
  last_sample_ = now;
}

bool ProgressLine::on_answer(std::uint64_t request_id, json::object const& message) {
  if (!inflight_ || *inflight_ != request_id) return false;
  inflight_.reset();
  auto const* res = message.if_contains("result");
  auto const* usage =
      res != nullptr && res->is_object() ? res->get_object().if_contains("usage") : nullptr;
  auto const* procs = usage != nullptr && usage->is_object()
                          ? usage->get_object().if_contains("processes")
                          : nullptr;
  if (procs != nullptr && procs->is_number()) {
    processes_ = procs->to_number<std::uint64_t>();
  } else {
    processes_.reset();  // no reading (yet, or any more): shown as unknown, never stale
  }
  return true;
}

void ProgressLine::tick(Clock::time_point now, std::uint64_t out_bytes) {
  if (!enabled_ || now - last_draw_ < kRedraw) return;
  last_draw_ = now;
  auto const tenths = std::chrono::duration_cast<milliseconds>(now - started_).count() / 100;
  std::string const procs = processes_ ? std::to_string(*processes_) : std::string{"?"};
  // \r and erase-line: one line, rewritten in place; never wider than a narrow terminal.
  fmt::print(stderr, "\r\x1b[K[custos] {}.{}s  out {}  processes {}", tenths / 10, tenths % 10,
             human_bytes(out_bytes), procs);
  std::fflush(stderr);
  shown_ = true;
}

void ProgressLine::hide() {
  if (!shown_) return;
  fmt::print(stderr, "\r\x1b[K");
  std::fflush(stderr);
  shown_ = false;  // drawn again at the next tick
}

}  // namespace custos::cli
