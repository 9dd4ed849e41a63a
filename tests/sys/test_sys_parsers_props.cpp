// Properties of the pure parsers behind the cgroup and marker shells (rapidcheck): escaped
// mountinfo paths round-trip, arbitrary input never breaks the parsers, and the marker is found
// exactly when its whole entry is present.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <string>
#include <vector>

#include "custos/sys/cgroup.hpp"
#include "custos/sys/procfs.hpp"

namespace custos::sys {
namespace {

std::string escape_mountinfo(std::string const& s) {
  std::string out;
  for (char const c : s) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\\') {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\%03o", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

RC_GTEST_PROP(SysParserProps, EscapedMountPointsRoundTrip, ()) {
  auto const tail =
      *rc::gen::container<std::string>(rc::gen::elementOf(std::string("abc/ \t\\\n-_.07")));
  std::string const path = "/" + tail;
  bool const nsdelegate = *rc::gen::arbitrary<bool>();
  bool const in_super = *rc::gen::arbitrary<bool>();
  std::string const opts = nsdelegate && !in_super ? "rw,nsdelegate" : "rw,relatime";
  std::string const super = nsdelegate && in_super ? "rw,nsdelegate,memory_recursiveprot" : "rw";
  std::string const table = "30 1 0:26 / /proc rw - proc proc rw\n41 31 0:38 / " +
                            escape_mountinfo(path) + " " + opts +
                            " shared:3 master:1 - cgroup2 cgroup2 " + super + "\n";
  auto m = parse_cgroup2_mount(table);
  RC_ASSERT(static_cast<bool>(m));
  RC_ASSERT(m->path == path);
  RC_ASSERT(m->nsdelegate == nsdelegate);
}

RC_GTEST_PROP(SysParserProps, ArbitraryTextNeverBreaksTheParsers, (std::string const& text)) {
  auto m = parse_cgroup2_mount(text);
  if (m) RC_ASSERT(!m->path.empty());
  auto own = parse_own_cgroup(text);
  if (own) RC_ASSERT(own->front() == '/');
  // Also with a cgroup2 marker in the middle of noise.
  (void)parse_cgroup2_mount(text + " - cgroup2 " + text + "\n");
}

RC_GTEST_PROP(SysParserProps, MarkerHexRoundTrips, ()) {
  Marker m;
  for (auto& b : m.bits) b = *rc::gen::arbitrary<std::uint8_t>();
  auto back = Marker::from_hex(m.env_value());
  RC_ASSERT(static_cast<bool>(back));
  RC_ASSERT(*back == m);
}

RC_GTEST_PROP(SysParserProps, MarkerFoundExactlyWhenItsWholeEntryIsPresent, ()) {
  Marker m;
  for (auto& b : m.bits) b = *rc::gen::arbitrary<std::uint8_t>();
  auto const entry_gen =
      rc::gen::container<std::string>(rc::gen::elementOf(std::string("ABC_=x0123456789abcdef"
                                                                     "CUSTOS_MARKER")));
  auto entries = *rc::gen::container<std::vector<std::string>>(entry_gen);
  // Near misses that must never match: the entry with a character more or less, or as a value.
  std::string const entry = m.env_entry();
  entries.push_back(entry.substr(0, entry.size() - 1));
  entries.push_back(entry + "0");
  entries.push_back("X" + entry);
  entries.push_back("A=" + entry);
  bool const insert = *rc::gen::arbitrary<bool>();
  if (insert) {
    auto const at = *rc::gen::inRange<std::size_t>(0, entries.size() + 1);
    entries.insert(entries.begin() + static_cast<std::ptrdiff_t>(at), entry);
  }
  std::string block;
  for (auto const& e : entries) {
    block += e;
    block.push_back('\0');
  }
  if (*rc::gen::arbitrary<bool>() && !block.empty()) block.pop_back();  // last NUL may be missing
  RC_ASSERT(environ_has_marker(block, m) == insert);
}

}  // namespace
}  // namespace custos::sys
