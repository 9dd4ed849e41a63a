// Canonical bytes: one versioned, deterministic, self-delimiting binary encoding.
//
// Every authority-relevant record (identity, plan, checked sandbox plan, terminal record) is
// turned into exactly one byte string, and digests are taken over those bytes. The format is
// specified byte for byte in docs/canonical-encoding.md; this header is its only implementation.
//
// Document := magic "CSTS" (4 bytes) | version u16 | kind u16 | body length u32 | fields
// Field    := tag u16 | type u8 | payload length u32 | payload
// All integers are fixed-width big-endian. Tags inside one record are strictly increasing; an
// optional field that is absent is simply not written. A record payload is kind u16 + fields; a
// list payload is element type u8 + count u32 + per element (length u32 + payload).
//
// The writer aborts the process on misuse (tags out of order, unbalanced begin/end, a payload
// over 4 GiB): those are programming errors in a fixed encoder, found by the unit tests, never a
// consequence of input. The reader never aborts: every malformed input is a canonical.* error.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/result.hpp"

namespace custos::core {

using Tag = std::uint16_t;

// Record kinds are global across the project so that a document says what it is. Ranges:
//   0x0001-0x00FF identity and plan (this file's owner), 0x0100-0x01FF lifecycle / terminal
//   record, 0x0200-0x02FF sandbox, 0x0300-0x03FF registry. Values never change once released.
using RecordKind = std::uint16_t;

inline constexpr std::array<std::uint8_t, 4> kCanonicalMagic = {0x43, 0x53, 0x54, 0x53};  // "CSTS"
inline constexpr std::uint16_t kCanonicalVersion = 1;
// magic + version + kind + body length
inline constexpr std::size_t kCanonicalHeaderBytes = 4 + 2 + 2 + 4;
// tag + type + payload length
inline constexpr std::size_t kCanonicalFieldHeaderBytes = 2 + 1 + 4;
// Nesting deeper than this is rejected by the reader (bounds recursion on hostile input).
inline constexpr std::size_t kCanonicalMaxDepth = 32;

enum class FieldType : std::uint8_t {
  u8 = 0x01,       // payload 1 byte
  u32 = 0x02,      // payload 4 bytes, big-endian
  u64 = 0x03,      // payload 8 bytes, big-endian
  i64 = 0x04,      // payload 8 bytes, two's complement, big-endian
  boolean = 0x05,  // payload 1 byte, 0x00 or 0x01 exactly
  bytes = 0x06,    // payload = the bytes
  string = 0x07,   // payload = the bytes of the string (no terminator, no transcoding)
  record = 0x08,   // payload = kind u16 + fields
  list = 0x09,     // payload = element type u8 + count u32 + (length u32 + payload) per element
};

[[nodiscard]] bool is_known_field_type(std::uint8_t t) noexcept;

// Builds one document. Usage:
//   CanonicalWriter w{kKindFoo};
//   w.u64(1, x).string(2, s);
//   w.begin_record(3, kKindBar); w.u8(1, y); w.end_record();
//   w.begin_list(4, FieldType::string); w.element_string("a"); w.end_list();
//   std::vector<std::uint8_t> bytes = std::move(w).finish();
class CanonicalWriter {
 public:
  explicit CanonicalWriter(RecordKind kind);

  CanonicalWriter(CanonicalWriter const&) = delete;
  CanonicalWriter& operator=(CanonicalWriter const&) = delete;
  CanonicalWriter(CanonicalWriter&&) noexcept = default;
  CanonicalWriter& operator=(CanonicalWriter&&) noexcept = default;
  ~CanonicalWriter() = default;

  // Scalar fields of the current record. Tags must be strictly increasing within a record.
  CanonicalWriter& u8(Tag tag, std::uint8_t v);
  CanonicalWriter& u32(Tag tag, std::uint32_t v);
  CanonicalWriter& u64(Tag tag, std::uint64_t v);
  CanonicalWriter& i64(Tag tag, std::int64_t v);
  CanonicalWriter& boolean(Tag tag, bool v);
  CanonicalWriter& bytes(Tag tag, std::span<std::uint8_t const> v);
  CanonicalWriter& string(Tag tag, std::string_view v);

  // A nested record field: begin_record, its fields, end_record.
  CanonicalWriter& begin_record(Tag tag, RecordKind kind);
  CanonicalWriter& end_record();

  // A list field of one element type, then its elements, then end_list.
  CanonicalWriter& begin_list(Tag tag, FieldType element_type);
  CanonicalWriter& element_u32(std::uint32_t v);
  CanonicalWriter& element_u64(std::uint64_t v);
  CanonicalWriter& element_string(std::string_view v);
  CanonicalWriter& element_bytes(std::span<std::uint8_t const> v);
  // A record element of a FieldType::record list: begin_element_record, fields, end_element_record.
  CanonicalWriter& begin_element_record(RecordKind kind);
  CanonicalWriter& end_element_record();
  CanonicalWriter& end_list();

  // Convenience for a whole list of strings.
  CanonicalWriter& string_list(Tag tag, std::span<std::string const> items);
  CanonicalWriter& u32_list(Tag tag, std::span<std::uint32_t const> items);

  // Nested record with a callable body: w.record(3, kind, [&](CanonicalWriter& r) { ... });
  template <class Body>
  CanonicalWriter& record(Tag tag, RecordKind kind, Body&& body) {
    begin_record(tag, kind);
    body(*this);
    return end_record();
  }

  // The finished document. Every begin_* must have been closed.
  [[nodiscard]] std::vector<std::uint8_t> finish() &&;

 private:
  enum class FrameKind : std::uint8_t { document, record, list, element_record };
  struct Frame {
    FrameKind kind;
    std::size_t length_at;   // offset of the u32 length to patch when the frame closes
    std::uint32_t last_tag;  // last field tag written (records/documents)
    FieldType element_type;  // lists only
    std::uint32_t count;     // lists only: elements written so far
    std::size_t count_at;    // lists only: offset of the u32 count
  };

  void field_header(Tag tag, FieldType type, std::size_t payload_len);
  std::size_t open_field(Tag tag, FieldType type);  // returns offset of the length to patch
  void open_element(FieldType type);                // inside a list, checks the element type
  void patch_length(std::size_t at);
  void put_u8(std::uint8_t v);
  void put_u16(std::uint16_t v);
  void put_u32(std::uint32_t v);
  void put_u64(std::uint64_t v);
  void put_raw(std::span<std::uint8_t const> v);
  Frame& top();

  std::vector<std::uint8_t> out_;
  std::vector<Frame> stack_;
};

class CanonicalListReader;

// Reads one record (a document's top level or a nested record). It does not own the bytes: the
// span given to open() must outlive every reader made from it.
//
// Reading is in tag order: each accessor consumes the next field, which must carry exactly the
// requested tag and type; has(tag) tells whether an optional field is present. finish() checks
// that nothing is left, so an unknown or duplicated field is always an error.
class CanonicalReader {
 public:
  // Checks magic, version, kind, body length and that nothing follows the document
  // (canonical.malformed / canonical.unsupported_version / canonical.trailing_bytes).
  [[nodiscard]] static Result<CanonicalReader> open(std::span<std::uint8_t const> doc,
                                                    RecordKind expected_kind);
  // The kind of a document without reading further (for dispatch); checks the header only.
  [[nodiscard]] static Result<RecordKind> peek_kind(std::span<std::uint8_t const> doc);

  [[nodiscard]] RecordKind kind() const noexcept { return kind_; }
  // True when the next unread field has this tag.
  [[nodiscard]] bool has(Tag tag) const noexcept;
  [[nodiscard]] bool at_end() const noexcept { return pos_ == fields_.size(); }

  [[nodiscard]] Result<std::uint8_t> u8(Tag tag);
  [[nodiscard]] Result<std::uint32_t> u32(Tag tag);
  [[nodiscard]] Result<std::uint64_t> u64(Tag tag);
  [[nodiscard]] Result<std::int64_t> i64(Tag tag);
  [[nodiscard]] Result<bool> boolean(Tag tag);
  [[nodiscard]] Result<std::vector<std::uint8_t>> bytes(Tag tag);
  [[nodiscard]] Result<std::string> string(Tag tag);
  // A nested record of exactly this kind, or of any kind (inspect kind() on the result).
  [[nodiscard]] Result<CanonicalReader> record(Tag tag, RecordKind expected_kind);
  [[nodiscard]] Result<CanonicalReader> record_any(Tag tag);
  [[nodiscard]] Result<CanonicalListReader> list(Tag tag, FieldType element_type);
  [[nodiscard]] Result<std::vector<std::string>> string_list(Tag tag);
  [[nodiscard]] Result<std::vector<std::uint32_t>> u32_list(Tag tag);

  // Optional variants: empty when the field is absent.
  [[nodiscard]] Result<std::optional<std::uint32_t>> optional_u32(Tag tag);
  [[nodiscard]] Result<std::optional<std::uint64_t>> optional_u64(Tag tag);
  [[nodiscard]] Result<std::optional<std::string>> optional_string(Tag tag);

  // Every field has been read (else canonical.malformed naming the first unread tag).
  [[nodiscard]] Result<> finish() const;

 private:
  friend class CanonicalListReader;
  CanonicalReader(RecordKind kind, std::span<std::uint8_t const> fields, std::size_t depth)
      : kind_(kind), fields_(fields), depth_(depth) {}
  // Validates the field framing of a record body (tags increasing, types known, lengths fit).
  [[nodiscard]] static Result<CanonicalReader> make(RecordKind kind,
                                                    std::span<std::uint8_t const> fields,
                                                    std::size_t depth);
  [[nodiscard]] Result<std::span<std::uint8_t const>> take(Tag tag, FieldType type);

  RecordKind kind_ = 0;
  std::span<std::uint8_t const> fields_;
  std::size_t pos_ = 0;
  std::size_t depth_ = 0;
};

// Reads the elements of one list field in order; finish() checks the count was consumed.
class CanonicalListReader {
 public:
  [[nodiscard]] std::uint32_t size() const noexcept { return count_; }
  [[nodiscard]] bool done() const noexcept { return read_ == count_; }
  [[nodiscard]] FieldType element_type() const noexcept { return type_; }

  [[nodiscard]] Result<std::uint32_t> next_u32();
  [[nodiscard]] Result<std::uint64_t> next_u64();
  [[nodiscard]] Result<std::string> next_string();
  [[nodiscard]] Result<std::vector<std::uint8_t>> next_bytes();
  [[nodiscard]] Result<CanonicalReader> next_record();
  [[nodiscard]] Result<> finish() const;

 private:
  friend class CanonicalReader;
  CanonicalListReader(FieldType type, std::uint32_t count, std::span<std::uint8_t const> elems,
                      std::size_t depth)
      : type_(type), count_(count), elems_(elems), depth_(depth) {}
  [[nodiscard]] Result<std::span<std::uint8_t const>> next(FieldType type);

  FieldType type_;
  std::uint32_t count_;
  std::uint32_t read_ = 0;
  std::span<std::uint8_t const> elems_;
  std::size_t pos_ = 0;
  std::size_t depth_ = 0;
};

// Lowercase hex of bytes (used by vectors, logs and digests).
[[nodiscard]] std::string to_hex(std::span<std::uint8_t const> bytes);
// Parses lowercase or uppercase hex; empty on odd length or a non-hex character.
[[nodiscard]] std::optional<std::vector<std::uint8_t>> from_hex(std::string_view hex);

}  // namespace custos::core
