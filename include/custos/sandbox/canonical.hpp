// Canonical bytes and digest of the checked sandbox plan (docs/canonical-encoding.md §6,
// "checked_sandbox"). The digest is the plan's sandbox_digest: core's plan encoding carries it
// (plan field 10, kind sandbox_digest), so plan_digest covers the checked plan without core
// knowing its layout.
//
// Layout (version 1 framing, core/canonical.hpp), kind 0x0200:
//   1 list of record fs_rule    one per path, ascending by path: 1 string path; 2 u8 rights
//                               (bit i = Right i: discover 0x01, metadata 0x02, read 0x04,
//                               execute 0x08, create 0x10, write 0x20, remove 0x40)
//   2 record process            1 boolean descendants; 2 u64 max_processes; 3 u8 signal_scope
//                               (1 = own_tree); 4 boolean run_as_root
//   3 record environment        1 list of string allow, ascending
//   4 record network            1 u8 outbound (1 = none, 2 = tcp_connect, 3 = any); 2 list of
//                               u32 tcp ports, ascending (empty unless tcp_connect)
//   5 list of record            one per delivery, ascending by (ref, channel, name, fd):
//                               secret_env (1 string ref; 2 string name), secret_file (1 string
//                               ref; 2 string name) or secret_fd (1 string ref; 2 u32 fd)
//   6 record resources          1 u8 enforce (bit i = ResourceDim i: wall_ms 0x01, cpu_ms
//                               0x02, memory_bytes 0x04, disk_bytes 0x08, output_bytes 0x10,
//                               descriptors 0x20, processes 0x40)
//   7 record terminal           1 u8 modes (pipes 0x01, pty 0x02); 2 boolean input;
//                               3 boolean resize
//   8 list of string controls   ascending
// Decoding is strict (framing, then every rule of a policy, then the controls must be exactly
// required_controls of the policy): decode(encode(x)) == x, encode(decode(b)) == b.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "custos/core/canonical.hpp"
#include "custos/core/digest.hpp"
#include "custos/core/result.hpp"
#include "custos/sandbox/types.hpp"

namespace custos::sandbox {

namespace kind {
inline constexpr core::RecordKind checked_sandbox = 0x0200;
inline constexpr core::RecordKind fs_rule = 0x0201;
inline constexpr core::RecordKind process = 0x0202;
inline constexpr core::RecordKind environment = 0x0203;
inline constexpr core::RecordKind network = 0x0204;
inline constexpr core::RecordKind secret_env = 0x0205;
inline constexpr core::RecordKind secret_file = 0x0206;
inline constexpr core::RecordKind secret_fd = 0x0207;
inline constexpr core::RecordKind resources = 0x0208;
inline constexpr core::RecordKind terminal = 0x0209;
}  // namespace kind

// The rules a policy obeys (what effective() produces), as findings; empty when it obeys them.
// Used by the decoder: bytes that break one are canonical.malformed.
[[nodiscard]] std::vector<std::string> policy_problems(SandboxPolicy const& policy);

[[nodiscard]] Result<std::vector<std::uint8_t>> encode(CheckedSandboxPlan const& checked);
[[nodiscard]] Result<CheckedSandboxPlan> decode(std::span<std::uint8_t const> doc);
// SHA-256 of encode(checked): the plan's sandbox_digest.
[[nodiscard]] Result<core::Digest> digest(CheckedSandboxPlan const& checked);

}  // namespace custos::sandbox
