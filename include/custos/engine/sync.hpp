// A blocking wrapper of the engine client for one-shot tools (`custos doctor`): each call runs
// the asynchronous call on a private io_context until it completes, so the deadline of the
// call bounds how long it blocks. Never use it on the daemon's loop.
#pragma once

#include <string>

#include "custos/engine/client.hpp"

namespace custos::engine {

class SyncClient {
 public:
  using Timeout = Client::Timeout;

  explicit SyncClient(Endpoint endpoint, Limits limits = {}, HostPaths host = {});
  SyncClient(SyncClient const&) = delete;
  SyncClient& operator=(SyncClient const&) = delete;

  [[nodiscard]] Result<EngineVersion> version(Timeout timeout);
  [[nodiscard]] Result<> ping(Timeout timeout);
  [[nodiscard]] Result<ContainerInfo> inspect_container(std::string const& ref, Timeout timeout);
  [[nodiscard]] Result<ExecInspect> inspect_exec(std::string const& id, Timeout timeout);

 private:
  template <class T, class Start>
  Result<T> run(Start start);

  boost::asio::io_context io_;
  Client client_;
};

}  // namespace custos::engine
