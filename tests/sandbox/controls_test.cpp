// The control vocabulary (controls.hpp) and admission against a descriptor (admission.hpp).
#include "custos/sandbox/controls.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <set>

#include "custos/sandbox/admission.hpp"

#include "sandbox/fixtures.hpp"

namespace custos::sandbox {
namespace {

using testing::req;
using testing::roomy_plan;

std::vector<std::string> controls_of(std::string_view sandbox) {
  return required_controls(effective(req(sandbox)));
}

bool has(std::vector<std::string> const& v, std::string_view c) {
  return std::find(v.begin(), v.end(), c) != v.end();
}

TEST(SandboxControls, OneTableSortedAndComplete) {
  auto const& table = sandbox_controls();
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < table.size(); ++i) {
    EXPECT_TRUE(names.insert(table[i].name).second) << table[i].name;
    EXPECT_FALSE(table[i].promise.empty()) << table[i].name;
    if (i > 0) {
      EXPECT_LT(table[i - 1].name, table[i].name);
    }
    auto const dot = table[i].name.find('.');
    ASSERT_NE(dot, std::string_view::npos);
    auto const domain = table[i].name.substr(0, dot);
    EXPECT_TRUE(domain == "filesystem" || domain == "process" || domain == "environment" ||
                domain == "network" || domain == "secrets")
        << table[i].name;
  }
  auto const all = all_controls();
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end()));
  EXPECT_EQ(all.size(), table.size() + core::kResourceDimCount - 1);  // no resources.concurrency
  EXPECT_FALSE(has(all, "resources.concurrency"));
  EXPECT_TRUE(has(all, "resources.memory_bytes"));
}

TEST(SandboxControls, EveryRequiredControlIsInTheVocabulary) {
  auto const all = all_controls();
  for (auto const* s : {
           "{}",
           R"({"filesystem": [{"path": "/a", "allow": ["metadata", "execute"]}]})",
           R"({"process": {"descendants": true, "max_processes": 3, "run_as_root": true}})",
           R"({"network": {"outbound": {"tcp_connect": [1]}}})",
           R"({"network": {"outbound": "any"}})",
           R"({"secrets": [{"ref": "a", "to": {"env": "A"}}, {"ref": "a", "to": {"file": "a"}},
                           {"ref": "a", "to": {"fd": 9}}]})",
           R"({"resources": {"enforce": ["wall_ms", "cpu_ms", "memory_bytes", "disk_bytes",
                                         "output_bytes", "descriptors", "processes"]}})",
       }) {
    for (auto const& c : controls_of(s)) EXPECT_TRUE(has(all, c)) << s << ": " << c;
  }
}

TEST(SandboxControls, EachRequirementAddsItsControl) {
  EXPECT_TRUE(has(controls_of("{}"), "process.no_descendants"));
  EXPECT_FALSE(has(controls_of("{}"), "process.max_processes"));
  auto const desc = controls_of(R"({"process": {"descendants": true, "max_processes": 4}})");
  EXPECT_TRUE(has(desc, "process.max_processes"));
  EXPECT_FALSE(has(desc, "process.no_descendants"));
  EXPECT_FALSE(has(controls_of(R"({"process": {"run_as_root": true}})"), "process.non_root"));
  auto const any = controls_of(R"({"network": {"outbound": "any"}})");
  EXPECT_FALSE(has(any, "network.none"));
  EXPECT_FALSE(has(any, "network.tcp_connect"));
  EXPECT_TRUE(has(any, "network.no_inbound"));  // inbound is always denied
  auto const tcp = controls_of(R"({"network": {"outbound": {"tcp_connect": [443]}}})");
  EXPECT_TRUE(has(tcp, "network.tcp_connect"));
  EXPECT_FALSE(has(tcp, "network.none"));
  auto const fd = controls_of(R"({"secrets": [{"ref": "a", "to": {"fd": 4}}]})");
  EXPECT_TRUE(has(fd, "secrets.fd"));
  EXPECT_FALSE(has(fd, "secrets.env"));
  auto const mem = controls_of(R"({"resources": {"enforce": ["memory_bytes"]}})");
  EXPECT_TRUE(has(mem, "resources.memory_bytes"));
  // The terminal domain needs no control: it is checked against the plan and enforced by the
  // supervisor for every backend.
  EXPECT_EQ(controls_of(R"({"terminal": {"modes": ["pipes", "pty"], "input": true}})"),
            controls_of("{}"));
}

TEST(SandboxControls, LandlockOnlyWhereAMountCannotExpressTheRights) {
  using R = Right;
  struct Case {
    RightSet rights;
    bool mount;
  };
  std::vector<Case> const cases = {
      {{}, true},
      {{R::discover, R::metadata, R::read}, true},
      {{R::discover, R::metadata, R::read, R::execute}, true},
      {{R::discover, R::metadata, R::read, R::create, R::write, R::remove}, true},
      {{R::discover, R::metadata, R::read, R::execute, R::create, R::write, R::remove}, true},
      {{R::metadata}, false},
      {{R::metadata, R::read}, false},  // read without discover
      {{R::metadata, R::execute}, false},
      {{R::discover, R::metadata, R::read, R::create}, false},  // create without write, remove
      {{R::discover, R::metadata, R::read, R::write}, false},
  };
  for (auto const& c : cases) {
    EXPECT_EQ(mount_expressible(c.rights), c.mount) << c.rights.bits();
    SandboxPolicy p;
    p.filesystem = {{"/a", c.rights}};
    EXPECT_EQ(has(required_controls(p), "filesystem.landlock"), !c.mount) << c.rights.bits();
  }
}

// ------------------------------------------------------------------------------ admission

Descriptor descriptor_with(std::vector<std::pair<std::string, ControlFidelity>> const& controls) {
  Descriptor d;
  d.kind = core::BackendKind::native;
  d.available = true;
  for (auto const& [name, f] : controls) d.add(name, f, "test");
  return d;
}

TEST(SandboxAdmission, EveryControlMustBeHard) {
  auto const checked =
      compile_plan(req(R"({"resources": {"enforce": ["memory_bytes"]}})"), roomy_plan()).value();
  Descriptor all;
  for (auto const& c : checked.controls) all.add(c, ControlFidelity::hard, "test");
  EXPECT_TRUE(missing_controls(checked, all).empty());
  // Sampled is not enforced, and an absent control is missing; the list is complete and sorted.
  auto d = descriptor_with({{"resources.memory_bytes", ControlFidelity::sampled},
                            {"process.no_new_privs", ControlFidelity::hard}});
  auto const missing = missing_controls(checked, d);
  EXPECT_EQ(missing.size(), checked.controls.size() - 1);
  EXPECT_TRUE(std::is_sorted(missing.begin(), missing.end()));
  EXPECT_TRUE(has(missing, "resources.memory_bytes"));
  EXPECT_FALSE(has(missing, "process.no_new_privs"));
}

TEST(SandboxAdmission, UnenforcedControlsAreListedHonestly) {
  Descriptor d;
  d.add("resources.wall_ms", ControlFidelity::hard, "timer");
  add_unenforced(d, "not enforced by this version");
  EXPECT_TRUE(std::is_sorted(d.controls.begin(), d.controls.end(),
                             [](Control const& a, Control const& b) { return a.name < b.name; }));
  for (auto const& c : sandbox_controls()) {
    auto const* got = d.find(c.name);
    ASSERT_NE(got, nullptr) << c.name;
    EXPECT_EQ(got->fidelity, ControlFidelity::none);
  }
  EXPECT_EQ(d.find("resources.wall_ms")->fidelity, ControlFidelity::hard);
  auto const checked = compile_plan(req("{}"), roomy_plan()).value();
  EXPECT_EQ(missing_controls(checked, d), checked.controls);
}

TEST(SandboxAdmission, UnsupportedCarriesTheMissingList) {
  auto e = unsupported(core::BackendKind::native, {"network.none", "process.pid_namespace"});
  EXPECT_EQ(e.code, Errc::sandbox_unsupported);
  EXPECT_EQ(e.missing, (std::vector<std::string>{"network.none", "process.pid_namespace"}));
  EXPECT_NE(e.context.find("network.none, process.pid_namespace"), std::string::npos);
}

RC_GTEST_PROP(SandboxAdmissionProps, AdmittedExactlyWhenNothingIsMissing, ()) {
  auto const checked = compile_plan(*testing::gen_requirements(), roomy_plan());
  RC_ASSERT(static_cast<bool>(checked));
  Descriptor d;
  std::set<std::string> dropped;
  for (auto const& c : checked->controls) {
    auto const f =
        *rc::gen::element(ControlFidelity::hard, ControlFidelity::sampled, ControlFidelity::none);
    if (*rc::gen::arbitrary<bool>()) d.add(c, f, "x");
    if (d.find(c) == nullptr || d.find(c)->fidelity != ControlFidelity::hard) dropped.insert(c);
  }
  auto const missing = missing_controls(*checked, d);
  bool const exact = std::set<std::string>(missing.begin(), missing.end()) == dropped;
  RC_ASSERT(exact);
}

}  // namespace
}  // namespace custos::sandbox
