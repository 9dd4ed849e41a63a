// Internal: the registry's SQL schema, its version history and the row <-> record mapping.
#pragma once

#include <string_view>

#include "custos/core/result.hpp"
#include "custos/registry/registry.hpp"
#include "custos/registry/sqlite.hpp"

namespace custos::registry::detail {

// The DDL of schema version 1 exactly as it was released. A new database is created as v1 and
// then migrated step by step, so a fresh file and a migrated one are the same shape by
// construction.
[[nodiscard]] std::string_view schema_v1_ddl() noexcept;

// Brings the database from `from` to kSchemaVersion, one step per transaction; each step
// writes its new version number last, in the same transaction.
// Errors: registry.migration_failed naming the failing step.
[[nodiscard]] Result<void> migrate(sql::Db& db, int from);

// Column list of SELECTs that decode a record (decode_row expects this order).
[[nodiscard]] std::string_view record_columns() noexcept;
// Decodes the current row of a statement selecting record_columns().
// Errors: registry.corrupt_record (an unknown phase/ownership/trigger/boundary wire value, a
// negative counter, a wrongly typed column).
[[nodiscard]] Result<ExecutionRecord> decode_row(sql::Stmt const& s);
// INSERT of a new record (all columns), or UPDATE of the columns an existing record may change.
[[nodiscard]] Result<void> write_row(sql::Db& db, ExecutionRecord const& rec, bool insert);

[[nodiscard]] std::int64_t now_ns() noexcept;

}  // namespace custos::registry::detail
