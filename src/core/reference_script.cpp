// The reference backend's script: its rules (plan.hpp, "reference script") and the signal names
// it may use. Parsing is in plan_json.cpp, the canonical layout in plan_canonical.cpp.
#include <array>
#include <type_traits>
#include <utility>

#include "custos/core/json_pointer.hpp"
#include "custos/core/plan.hpp"
#include "custos/core/wire_names.hpp"

namespace custos::core {
namespace {

void add(std::vector<Diagnostic>& out, Errc code, std::string ptr, std::string msg) {
  out.push_back(Diagnostic{code, std::move(ptr), std::move(msg)});
}

std::string num(std::uint64_t v) {
  return std::to_string(v);
}

constexpr auto kScriptStreamNames = wire_names<ScriptStream>({
    {ScriptStream::stdout_stream, "stdout"},
    {ScriptStream::stderr_stream, "stderr"},
});
static_assert(kScriptStreamNames.complete(1));

struct NamedSignal {
  std::string_view name;
  std::uint32_t number;
};

// Default action "terminate" or "core" (signal(7)), Linux asm-generic numbers.
constexpr std::array<NamedSignal, 23> kTerminating = {{
    {"SIGHUP", 1},     {"SIGINT", 2},   {"SIGQUIT", 3},  {"SIGILL", 4},     {"SIGTRAP", 5},
    {"SIGABRT", 6},    {"SIGBUS", 7},   {"SIGFPE", 8},   {"SIGKILL", 9},    {"SIGUSR1", 10},
    {"SIGSEGV", 11},   {"SIGUSR2", 12}, {"SIGPIPE", 13}, {"SIGALRM", 14},   {"SIGTERM", 15},
    {"SIGSTKFLT", 16}, {"SIGXCPU", 24}, {"SIGXFSZ", 25}, {"SIGVTALRM", 26}, {"SIGPROF", 27},
    {"SIGIO", 29},     {"SIGPWR", 30},  {"SIGSYS", 31},
}};

// Adds `v` to a running total that must stay within `bound`; false (and the total saturated
// past the bound) once it does not, so the bound is reported once, at the step that crossed it.
bool accumulate(std::uint64_t& total, std::uint64_t v, std::uint64_t bound) {
  if (total > bound) return true;  // already reported
  total = v > bound - total ? bound + 1 : total + v;
  return total <= bound;
}

}  // namespace

std::optional<std::uint32_t> terminating_signal_from_name(std::string_view name) noexcept {
  for (auto const& s : kTerminating) {
    if (s.name == name) return s.number;
  }
  return std::nullopt;
}

std::optional<std::string_view> terminating_signal_name(std::uint32_t number) noexcept {
  for (auto const& s : kTerminating) {
    if (s.number == number) return s.name;
  }
  return std::nullopt;
}

std::string_view to_string(ScriptStream s) noexcept {
  return kScriptStreamNames.wire(s);
}

std::optional<ScriptStream> script_stream_from(std::string_view s) noexcept {
  return kScriptStreamNames.from_wire(s);
}

std::string_view script_step_key(ScriptStep const& step) noexcept {
  static_assert(std::size(kScriptStepKeys) == std::variant_size_v<ScriptStep>);
  return kScriptStepKeys[step.index()];
}

std::variant<script::Exit, script::Signal> script_end(ReferenceScript const& s) {
  if (!s.steps.empty()) {
    if (auto const* e = std::get_if<script::Exit>(&s.steps.back())) return *e;
    if (auto const* g = std::get_if<script::Signal>(&s.steps.back())) return *g;
  }
  return script::Exit{0};
}

namespace {

// Checks one step at a time, in order, keeping the script-wide totals.
class StepChecker {
 public:
  explicit StepChecker(std::vector<Diagnostic>& out) : out_(out) {}

  // `at` is the step's pointer, `key` the pointer of its step key's member.
  void check(ScriptStep const& step, std::string const& at, std::string const& key) {
    at_ = &at;
    key_ = &key;
    std::visit(*this, step);
  }

  void operator()(script::Write const& st) {
    if (st.stream != ScriptStream::stdout_stream && st.stream != ScriptStream::stderr_stream) {
      add(out_, kCode, *key_, "must be stdout or stderr");
    }
    std::string const data = pointer_append(*at_, "data_b64");
    if (st.data.empty()) {
      add(out_, kCode, data, "writes nothing (a step must do something)");
    } else if (!accumulate(written_, st.data.size(), kMaxScriptWriteBytes)) {
      add(out_, Errc::plan_too_large, data,
          "the script writes more than " + num(kMaxScriptWriteBytes) + " bytes in all");
    }
  }
  void operator()(script::Sleep const& st) {
    counted(st.ms, slept_, kMaxScriptSleepMs, "the script sleeps more than % ms in all");
  }
  void operator()(script::Spawn const& st) {
    counted(st.count, spawned_, kMaxScriptSpawn,
            "the script spawns more than % descendants in all");
  }
  void operator()(script::ReadStdin const& st) {
    counted(st.bytes, read_, kMaxPlanNumber, "the script reads more than % bytes of stdin in all");
  }
  void operator()(script::Ignore const& st) {
    if (!signal_name(st.signal)) {
      add(out_, kCode, *key_,
          "must be a signal a graceful stop may send (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, "
          "SIGUSR2)");
    }
  }
  void operator()(script::Use const& st) {
    static_assert(script::Use::kFieldCount == 4);
    auto const& [cpu, memory, disk, descriptors] = st;
    std::array<std::optional<std::uint64_t> const*, 4> const members = {&cpu, &memory, &disk,
                                                                        &descriptors};
    bool any = false;
    for (std::size_t m = 0; m < members.size(); ++m) {
      if (!*members[m]) continue;
      any = true;
      if (**members[m] > kMaxPlanNumber) {
        add(out_, kCode, pointer_append(*key_, kScriptUseNames[m]),
            "must be at most " + num(kMaxPlanNumber));
      }
    }
    if (!any) {
      add(out_, kCode, *key_, "names no resource (cpu_ms, memory_bytes, disk_bytes, descriptors)");
    }
  }
  void operator()(script::Exit const&) {}  // every code 0..255 is an exit code
  void operator()(script::Signal const& st) {
    if (!terminating_signal_name(st.signal)) {
      add(out_, kCode, *key_, "must be a signal that ends a process (SIGSEGV, SIGKILL, ...)");
    }
  }

 private:
  static constexpr Errc kCode = Errc::plan_invalid_backend;

  // A count that must be at least 1, summed over the script up to `bound`; `what` has a % where
  // the bound goes.
  void counted(std::uint64_t v, std::uint64_t& total, std::uint64_t bound, std::string what) {
    if (v == 0) {
      add(out_, kCode, *key_, "must be at least 1 (a step must do something)");
    } else if (!accumulate(total, v, bound)) {
      what.replace(what.find('%'), 1, num(bound));
      add(out_, Errc::plan_too_large, *key_, std::move(what));
    }
  }

  std::vector<Diagnostic>& out_;
  std::string const* at_ = nullptr;
  std::string const* key_ = nullptr;
  std::uint64_t written_ = 0;
  std::uint64_t slept_ = 0;
  std::uint64_t spawned_ = 0;
  std::uint64_t read_ = 0;
};

bool ends_script(ScriptStep const& step) {
  return std::holds_alternative<script::Exit>(step) || std::holds_alternative<script::Signal>(step);
}

}  // namespace

void validate_script(ReferenceScript const& s, std::string const& ptr,
                     std::vector<Diagnostic>& out) {
  std::string const steps = pointer_append(ptr, "steps");
  if (s.steps.size() > kMaxScriptSteps) {
    add(out, Errc::plan_too_large, steps, "more than " + num(kMaxScriptSteps) + " steps");
    return;
  }
  StepChecker checker(out);
  std::optional<std::size_t> end_at;  // the first exit or signal step
  for (std::size_t i = 0; i < s.steps.size(); ++i) {
    std::string const at = pointer_append(steps, i);
    if (end_at && *end_at + 1 == i) {
      // Reported once, at the first step that follows the end.
      add(out, Errc::plan_invalid_backend, at,
          "follows the script's " + std::string{script_step_key(s.steps[*end_at])} + " step at " +
              pointer_append(steps, *end_at) + ": nothing runs after the end");
    }
    checker.check(s.steps[i], at, pointer_append(at, script_step_key(s.steps[i])));
    if (!end_at && ends_script(s.steps[i])) end_at = i;
  }
}

}  // namespace custos::core
