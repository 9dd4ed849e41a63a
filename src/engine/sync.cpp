#include "custos/engine/sync.hpp"

#include <optional>

namespace custos::engine {

SyncClient::SyncClient(Endpoint endpoint, Limits limits, HostPaths host)
    : client_(io_, std::move(endpoint), limits, std::move(host)) {}

template <class T, class Start>
Result<T> SyncClient::run(Start start) {
  std::optional<Result<T>> out;
  start([&out](Result<T> r) { out.emplace(std::move(r)); });
  io_.restart();
  // Every call completes by its deadline, so this loop ends; run_one returning 0 with no
  // result would be a call that lost its handler.
  while (!out && io_.run_one() != 0) {
  }
  if (!out) return Error{Errc::internal, "engine call ended without a result"};
  return std::move(*out);
}

Result<EngineVersion> SyncClient::version(Timeout timeout) {
  return run<EngineVersion>([&](auto done) { client_.version(timeout, std::move(done)); });
}

Result<> SyncClient::ping(Timeout timeout) {
  return run<void>([&](auto done) { client_.ping(timeout, std::move(done)); });
}

Result<ContainerInfo> SyncClient::inspect_container(std::string const& ref, Timeout timeout) {
  return run<ContainerInfo>(
      [&](auto done) { client_.inspect_container(ref, timeout, std::move(done)); });
}

Result<ExecInspect> SyncClient::inspect_exec(std::string const& id, Timeout timeout) {
  return run<ExecInspect>([&](auto done) { client_.inspect_exec(id, timeout, std::move(done)); });
}

}  // namespace custos::engine
