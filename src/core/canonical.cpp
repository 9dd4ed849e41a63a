// The canonical codec: framing only. What each record contains is decided by its encoder
// (plan_canonical.cpp for identity and plan); see docs/canonical-encoding.md.
#include "custos/core/canonical.hpp"

#include <cstdlib>
#include <limits>
#include <utility>

namespace custos::core {
namespace {

// A misused writer is a bug in a fixed encoder, never a reaction to input; stopping is the only
// way to guarantee that wrong bytes are never digested and stored.
[[noreturn]] void writer_contract_violation() {
  std::abort();
}

Error malformed(std::string what) {
  return Error{Errc::canonical_malformed, std::move(what)};
}

std::uint16_t get_u16(std::span<std::uint8_t const> b, std::size_t at) {
  return static_cast<std::uint16_t>((static_cast<unsigned>(b[at]) << 8U) | b[at + 1]);
}

std::uint32_t get_u32(std::span<std::uint8_t const> b, std::size_t at) {
  return (static_cast<std::uint32_t>(b[at]) << 24U) |
         (static_cast<std::uint32_t>(b[at + 1]) << 16U) |
         (static_cast<std::uint32_t>(b[at + 2]) << 8U) | static_cast<std::uint32_t>(b[at + 3]);
}

std::uint64_t get_u64(std::span<std::uint8_t const> b, std::size_t at) {
  return (static_cast<std::uint64_t>(get_u32(b, at)) << 32U) | get_u32(b, at + 4);
}

std::string tag_text(Tag tag) {
  return "tag " + std::to_string(tag);
}

// Fixed payload width of a scalar type, 0 for variable-length types.
std::size_t fixed_width(FieldType t) {
  switch (t) {
    case FieldType::u8:
    case FieldType::boolean:
      return 1;
    case FieldType::u32:
      return 4;
    case FieldType::u64:
    case FieldType::i64:
      return 8;
    case FieldType::bytes:
    case FieldType::string:
    case FieldType::record:
    case FieldType::list:
      return 0;
  }
  return 0;
}

// Checks a scalar payload has exactly its type's width and, for booleans, a valid value.
Result<> check_scalar(FieldType t, std::span<std::uint8_t const> payload,
                      std::string const& where) {
  std::size_t const w = fixed_width(t);
  if (w != 0 && payload.size() != w) {
    return malformed(where + ": payload of " + std::to_string(payload.size()) +
                     " bytes for a fixed-width type of " + std::to_string(w));
  }
  if (t == FieldType::boolean && payload[0] > 1) {
    return malformed(where + ": boolean byte is neither 0 nor 1");
  }
  if (t == FieldType::record && payload.size() < 2) {
    return malformed(where + ": record payload shorter than its kind");
  }
  if (t == FieldType::list && payload.size() < 5) {
    return malformed(where + ": list payload shorter than its header");
  }
  return ok();
}

}  // namespace

bool is_known_field_type(std::uint8_t t) noexcept {
  return t >= 0x01 && t <= 0x09;
}

// ---------------------------------------------------------------------------------- writer

CanonicalWriter::CanonicalWriter(RecordKind kind) {
  out_.reserve(256);
  put_raw(kCanonicalMagic);
  put_u16(kCanonicalVersion);
  put_u16(kind);
  std::size_t const at = out_.size();
  put_u32(0);
  stack_.push_back(Frame{FrameKind::document, at, 0, FieldType::u8, 0, 0});
}

CanonicalWriter::Frame& CanonicalWriter::top() {
  if (stack_.empty()) writer_contract_violation();
  return stack_.back();
}

void CanonicalWriter::put_u8(std::uint8_t v) {
  out_.push_back(v);
}

void CanonicalWriter::put_u16(std::uint16_t v) {
  out_.push_back(static_cast<std::uint8_t>(v >> 8U));
  out_.push_back(static_cast<std::uint8_t>(v & 0xFFU));
}

void CanonicalWriter::put_u32(std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out_.push_back(static_cast<std::uint8_t>((v >> static_cast<unsigned>(shift)) & 0xFFU));
  }
}

void CanonicalWriter::put_u64(std::uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) {
    out_.push_back(static_cast<std::uint8_t>((v >> static_cast<unsigned>(shift)) & 0xFFU));
  }
}

void CanonicalWriter::put_raw(std::span<std::uint8_t const> v) {
  out_.insert(out_.end(), v.begin(), v.end());
}

void CanonicalWriter::patch_length(std::size_t at) {
  std::size_t const len = out_.size() - (at + 4);
  if (len > std::numeric_limits<std::uint32_t>::max()) writer_contract_violation();
  auto const v = static_cast<std::uint32_t>(len);
  out_[at] = static_cast<std::uint8_t>(v >> 24U);
  out_[at + 1] = static_cast<std::uint8_t>((v >> 16U) & 0xFFU);
  out_[at + 2] = static_cast<std::uint8_t>((v >> 8U) & 0xFFU);
  out_[at + 3] = static_cast<std::uint8_t>(v & 0xFFU);
}

std::size_t CanonicalWriter::open_field(Tag tag, FieldType type) {
  Frame& f = top();
  if (f.kind != FrameKind::document && f.kind != FrameKind::record &&
      f.kind != FrameKind::element_record) {
    writer_contract_violation();  // a field inside a list: use element_* instead
  }
  if (tag == 0 || tag <= f.last_tag) writer_contract_violation();
  f.last_tag = tag;
  put_u16(tag);
  put_u8(static_cast<std::uint8_t>(type));
  std::size_t const at = out_.size();
  put_u32(0);
  return at;
}

void CanonicalWriter::field_header(Tag tag, FieldType type, std::size_t payload_len) {
  if (payload_len > std::numeric_limits<std::uint32_t>::max()) writer_contract_violation();
  std::size_t const at = open_field(tag, type);
  out_.resize(at);
  put_u32(static_cast<std::uint32_t>(payload_len));
}

CanonicalWriter& CanonicalWriter::u8(Tag tag, std::uint8_t v) {
  field_header(tag, FieldType::u8, 1);
  put_u8(v);
  return *this;
}

CanonicalWriter& CanonicalWriter::u32(Tag tag, std::uint32_t v) {
  field_header(tag, FieldType::u32, 4);
  put_u32(v);
  return *this;
}

CanonicalWriter& CanonicalWriter::u64(Tag tag, std::uint64_t v) {
  field_header(tag, FieldType::u64, 8);
  put_u64(v);
  return *this;
}

CanonicalWriter& CanonicalWriter::i64(Tag tag, std::int64_t v) {
  field_header(tag, FieldType::i64, 8);
  put_u64(static_cast<std::uint64_t>(v));  // two's complement by definition since C++20
  return *this;
}

CanonicalWriter& CanonicalWriter::boolean(Tag tag, bool v) {
  field_header(tag, FieldType::boolean, 1);
  put_u8(v ? 1 : 0);
  return *this;
}

CanonicalWriter& CanonicalWriter::bytes(Tag tag, std::span<std::uint8_t const> v) {
  field_header(tag, FieldType::bytes, v.size());
  put_raw(v);
  return *this;
}

CanonicalWriter& CanonicalWriter::string(Tag tag, std::string_view v) {
  field_header(tag, FieldType::string, v.size());
  for (char c : v) put_u8(static_cast<std::uint8_t>(c));
  return *this;
}

CanonicalWriter& CanonicalWriter::begin_record(Tag tag, RecordKind kind) {
  std::size_t const at = open_field(tag, FieldType::record);
  put_u16(kind);
  stack_.push_back(Frame{FrameKind::record, at, 0, FieldType::u8, 0, 0});
  return *this;
}

CanonicalWriter& CanonicalWriter::end_record() {
  if (top().kind != FrameKind::record) writer_contract_violation();
  patch_length(top().length_at);
  stack_.pop_back();
  return *this;
}

CanonicalWriter& CanonicalWriter::begin_list(Tag tag, FieldType element_type) {
  std::size_t const at = open_field(tag, FieldType::list);
  put_u8(static_cast<std::uint8_t>(element_type));
  std::size_t const count_at = out_.size();
  put_u32(0);
  stack_.push_back(Frame{FrameKind::list, at, 0, element_type, 0, count_at});
  return *this;
}

void CanonicalWriter::open_element(FieldType type) {
  Frame& f = top();
  if (f.kind != FrameKind::list || f.element_type != type) writer_contract_violation();
  if (f.count == std::numeric_limits<std::uint32_t>::max()) writer_contract_violation();
  ++f.count;
}

CanonicalWriter& CanonicalWriter::element_u32(std::uint32_t v) {
  open_element(FieldType::u32);
  put_u32(4);
  put_u32(v);
  return *this;
}

CanonicalWriter& CanonicalWriter::element_u64(std::uint64_t v) {
  open_element(FieldType::u64);
  put_u32(8);
  put_u64(v);
  return *this;
}

CanonicalWriter& CanonicalWriter::element_string(std::string_view v) {
  open_element(FieldType::string);
  if (v.size() > std::numeric_limits<std::uint32_t>::max()) writer_contract_violation();
  put_u32(static_cast<std::uint32_t>(v.size()));
  for (char c : v) put_u8(static_cast<std::uint8_t>(c));
  return *this;
}

CanonicalWriter& CanonicalWriter::element_bytes(std::span<std::uint8_t const> v) {
  open_element(FieldType::bytes);
  if (v.size() > std::numeric_limits<std::uint32_t>::max()) writer_contract_violation();
  put_u32(static_cast<std::uint32_t>(v.size()));
  put_raw(v);
  return *this;
}

CanonicalWriter& CanonicalWriter::begin_element_record(RecordKind kind) {
  open_element(FieldType::record);
  std::size_t const at = out_.size();
  put_u32(0);
  put_u16(kind);
  stack_.push_back(Frame{FrameKind::element_record, at, 0, FieldType::u8, 0, 0});
  return *this;
}

CanonicalWriter& CanonicalWriter::end_element_record() {
  if (top().kind != FrameKind::element_record) writer_contract_violation();
  patch_length(top().length_at);
  stack_.pop_back();
  return *this;
}

CanonicalWriter& CanonicalWriter::end_list() {
  Frame const f = top();
  if (f.kind != FrameKind::list) writer_contract_violation();
  out_[f.count_at] = static_cast<std::uint8_t>(f.count >> 24U);
  out_[f.count_at + 1] = static_cast<std::uint8_t>((f.count >> 16U) & 0xFFU);
  out_[f.count_at + 2] = static_cast<std::uint8_t>((f.count >> 8U) & 0xFFU);
  out_[f.count_at + 3] = static_cast<std::uint8_t>(f.count & 0xFFU);
  patch_length(f.length_at);
  stack_.pop_back();
  return *this;
}

CanonicalWriter& CanonicalWriter::string_list(Tag tag, std::span<std::string const> items) {
  begin_list(tag, FieldType::string);
  for (auto const& s : items) element_string(s);
  return end_list();
}

CanonicalWriter& CanonicalWriter::u32_list(Tag tag, std::span<std::uint32_t const> items) {
  begin_list(tag, FieldType::u32);
  for (auto v : items) element_u32(v);
  return end_list();
}

std::vector<std::uint8_t> CanonicalWriter::finish() && {
  if (stack_.size() != 1 || stack_.front().kind != FrameKind::document) writer_contract_violation();
  patch_length(stack_.front().length_at);
  stack_.clear();
  return std::move(out_);
}

// ---------------------------------------------------------------------------------- reader

Result<RecordKind> CanonicalReader::peek_kind(std::span<std::uint8_t const> doc) {
  if (doc.size() < kCanonicalHeaderBytes) return malformed("document shorter than its header");
  for (std::size_t i = 0; i < kCanonicalMagic.size(); ++i) {
    if (doc[i] != kCanonicalMagic[i]) return malformed("bad magic");
  }
  std::uint16_t const version = get_u16(doc, 4);
  if (version != kCanonicalVersion) {
    return Error{Errc::canonical_unsupported_version, "version " + std::to_string(version)};
  }
  return get_u16(doc, 6);
}

Result<CanonicalReader> CanonicalReader::open(std::span<std::uint8_t const> doc,
                                              RecordKind expected_kind) {
  RecordKind const kind = CUSTOS_TRY(peek_kind(doc));
  if (kind != expected_kind) {
    return malformed("document kind " + std::to_string(kind) + ", expected " +
                     std::to_string(expected_kind));
  }
  std::uint32_t const body = get_u32(doc, 8);
  std::size_t const avail = doc.size() - kCanonicalHeaderBytes;
  if (body > avail) return malformed("body length exceeds the document");
  if (body < avail) {
    return Error{Errc::canonical_trailing_bytes,
                 std::to_string(avail - body) + " bytes after the document"};
  }
  return make(kind, doc.subspan(kCanonicalHeaderBytes), 0);
}

Result<CanonicalReader> CanonicalReader::make(RecordKind kind, std::span<std::uint8_t const> fields,
                                              std::size_t depth) {
  if (depth > kCanonicalMaxDepth) return malformed("records nested too deeply");
  // Walk the framing once so that every later accessor can trust the field boundaries.
  std::size_t at = 0;
  std::uint32_t last_tag = 0;
  while (at < fields.size()) {
    if (fields.size() - at < kCanonicalFieldHeaderBytes) return malformed("truncated field header");
    Tag const tag = get_u16(fields, at);
    std::uint8_t const type = fields[at + 2];
    std::uint32_t const len = get_u32(fields, at + 3);
    std::string const where = tag_text(tag);
    if (tag == 0) return malformed("field tag 0 is reserved");
    if (tag <= last_tag) return malformed(where + ": tags not strictly increasing");
    if (!is_known_field_type(type))
      return malformed(where + ": unknown field type " + std::to_string(type));
    at += kCanonicalFieldHeaderBytes;
    if (len > fields.size() - at) return malformed(where + ": payload runs past its record");
    CUSTOS_TRYV(check_scalar(static_cast<FieldType>(type), fields.subspan(at, len), where));
    at += len;
    last_tag = tag;
  }
  return CanonicalReader{kind, fields, depth};
}

bool CanonicalReader::has(Tag tag) const noexcept {
  return fields_.size() - pos_ >= kCanonicalFieldHeaderBytes && get_u16(fields_, pos_) == tag;
}

Result<std::span<std::uint8_t const>> CanonicalReader::take(Tag tag, FieldType type) {
  if (at_end()) return malformed(tag_text(tag) + ": missing (record ended)");
  Tag const got = get_u16(fields_, pos_);
  if (got != tag) {
    return malformed(tag_text(tag) + ": missing (found " + tag_text(got) + ")");
  }
  auto const got_type = static_cast<FieldType>(fields_[pos_ + 2]);
  if (got_type != type) {
    return malformed(tag_text(tag) + ": type " + std::to_string(static_cast<unsigned>(got_type)) +
                     ", expected " + std::to_string(static_cast<unsigned>(type)));
  }
  std::uint32_t const len = get_u32(fields_, pos_ + 3);
  auto payload = fields_.subspan(pos_ + kCanonicalFieldHeaderBytes, len);
  pos_ += kCanonicalFieldHeaderBytes + len;
  return payload;
}

Result<std::uint8_t> CanonicalReader::u8(Tag tag) {
  auto p = CUSTOS_TRY(take(tag, FieldType::u8));
  return p[0];
}

Result<std::uint32_t> CanonicalReader::u32(Tag tag) {
  auto p = CUSTOS_TRY(take(tag, FieldType::u32));
  return get_u32(p, 0);
}

Result<std::uint64_t> CanonicalReader::u64(Tag tag) {
  auto p = CUSTOS_TRY(take(tag, FieldType::u64));
  return get_u64(p, 0);
}

Result<std::int64_t> CanonicalReader::i64(Tag tag) {
  auto p = CUSTOS_TRY(take(tag, FieldType::i64));
  return static_cast<std::int64_t>(get_u64(p, 0));
}

Result<bool> CanonicalReader::boolean(Tag tag) {
  auto p = CUSTOS_TRY(take(tag, FieldType::boolean));
  return p[0] == 1;
}

Result<std::vector<std::uint8_t>> CanonicalReader::bytes(Tag tag) {
  auto p = CUSTOS_TRY(take(tag, FieldType::bytes));
  return std::vector<std::uint8_t>(p.begin(), p.end());
}

Result<std::string> CanonicalReader::string(Tag tag) {
  auto p = CUSTOS_TRY(take(tag, FieldType::string));
  return std::string(p.begin(), p.end());
}

Result<CanonicalReader> CanonicalReader::record_any(Tag tag) {
  auto p = CUSTOS_TRY(take(tag, FieldType::record));
  return make(get_u16(p, 0), p.subspan(2), depth_ + 1);
}

Result<CanonicalReader> CanonicalReader::record(Tag tag, RecordKind expected_kind) {
  auto r = CUSTOS_TRY(record_any(tag));
  if (r.kind() != expected_kind) {
    return malformed(tag_text(tag) + ": record kind " + std::to_string(r.kind()) + ", expected " +
                     std::to_string(expected_kind));
  }
  return r;
}

Result<CanonicalListReader> CanonicalReader::list(Tag tag, FieldType element_type) {
  auto p = CUSTOS_TRY(take(tag, FieldType::list));
  auto const type = p[0];
  if (type != static_cast<std::uint8_t>(element_type)) {
    return malformed(tag_text(tag) + ": list of element type " + std::to_string(type) +
                     ", expected " + std::to_string(static_cast<unsigned>(element_type)));
  }
  std::uint32_t const count = get_u32(p, 1);
  auto elems = p.subspan(5);
  // Each element costs at least its 4-byte length, so a count beyond that is a lie; checking
  // here keeps a hostile count from driving a large reservation.
  if (count > elems.size() / 4) return malformed(tag_text(tag) + ": list count exceeds its bytes");
  return CanonicalListReader{element_type, count, elems, depth_ + 1};
}

Result<std::vector<std::string>> CanonicalReader::string_list(Tag tag) {
  auto l = CUSTOS_TRY(list(tag, FieldType::string));
  std::vector<std::string> out;
  out.reserve(l.size());
  while (!l.done()) out.push_back(CUSTOS_TRY(l.next_string()));
  CUSTOS_TRYV(l.finish());
  return out;
}

Result<std::vector<std::uint32_t>> CanonicalReader::u32_list(Tag tag) {
  auto l = CUSTOS_TRY(list(tag, FieldType::u32));
  std::vector<std::uint32_t> out;
  out.reserve(l.size());
  while (!l.done()) out.push_back(CUSTOS_TRY(l.next_u32()));
  CUSTOS_TRYV(l.finish());
  return out;
}

Result<std::optional<std::uint32_t>> CanonicalReader::optional_u32(Tag tag) {
  if (!has(tag)) return std::optional<std::uint32_t>{};
  return std::optional<std::uint32_t>{CUSTOS_TRY(u32(tag))};
}

Result<std::optional<std::uint64_t>> CanonicalReader::optional_u64(Tag tag) {
  if (!has(tag)) return std::optional<std::uint64_t>{};
  return std::optional<std::uint64_t>{CUSTOS_TRY(u64(tag))};
}

Result<std::optional<std::string>> CanonicalReader::optional_string(Tag tag) {
  if (!has(tag)) return std::optional<std::string>{};
  return std::optional<std::string>{CUSTOS_TRY(string(tag))};
}

Result<> CanonicalReader::finish() const {
  if (!at_end()) {
    return malformed("unexpected field " + tag_text(get_u16(fields_, pos_)) + " in record kind " +
                     std::to_string(kind_));
  }
  return ok();
}

// ---------------------------------------------------------------------------------- lists

Result<std::span<std::uint8_t const>> CanonicalListReader::next(FieldType type) {
  if (type != type_) return malformed("list element read with the wrong type");
  if (done()) return malformed("read past the end of a list");
  if (elems_.size() - pos_ < 4) return malformed("truncated list element length");
  std::uint32_t const len = get_u32(elems_, pos_);
  pos_ += 4;
  if (len > elems_.size() - pos_) return malformed("list element runs past its list");
  auto payload = elems_.subspan(pos_, len);
  CUSTOS_TRYV(check_scalar(type, payload, "list element " + std::to_string(read_)));
  pos_ += len;
  ++read_;
  return payload;
}

Result<std::uint32_t> CanonicalListReader::next_u32() {
  auto p = CUSTOS_TRY(next(FieldType::u32));
  return get_u32(p, 0);
}

Result<std::uint64_t> CanonicalListReader::next_u64() {
  auto p = CUSTOS_TRY(next(FieldType::u64));
  return get_u64(p, 0);
}

Result<std::string> CanonicalListReader::next_string() {
  auto p = CUSTOS_TRY(next(FieldType::string));
  return std::string(p.begin(), p.end());
}

Result<std::vector<std::uint8_t>> CanonicalListReader::next_bytes() {
  auto p = CUSTOS_TRY(next(FieldType::bytes));
  return std::vector<std::uint8_t>(p.begin(), p.end());
}

Result<CanonicalReader> CanonicalListReader::next_record() {
  auto p = CUSTOS_TRY(next(FieldType::record));
  return CanonicalReader::make(get_u16(p, 0), p.subspan(2), depth_ + 1);
}

Result<> CanonicalListReader::finish() const {
  if (!done()) return malformed("list has unread elements");
  if (pos_ != elems_.size()) return malformed("bytes after the last list element");
  return ok();
}

// ---------------------------------------------------------------------------------- hex

std::string to_hex(std::span<std::uint8_t const> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (auto b : bytes) {
    out.push_back(kDigits[b >> 4U]);
    out.push_back(kDigits[b & 0x0FU]);
  }
  return out;
}

std::optional<std::vector<std::uint8_t>> from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::vector<std::uint8_t> out;
  out.reserve(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    int const hi = nibble(hex[i]);
    int const lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<std::uint8_t>((hi << 4) | lo));
  }
  return out;
}

}  // namespace custos::core
