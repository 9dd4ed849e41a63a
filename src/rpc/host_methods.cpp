// host.info and rpc.methods.
#include <algorithm>

#include "custos/rpc/methods.hpp"

namespace custos::rpc {

namespace json = boost::json;

void register_host_methods(Dispatcher& d,
                           std::function<Result<std::shared_ptr<std::string const>>()> describe) {
  d.add_text("host.info", Access::any,
             [describe = std::move(describe)](std::shared_ptr<Session> const&,
                                              json::object const&) { return describe(); });
}

void register_introspection(Dispatcher& d) {
  d.add("rpc.methods", Access::any,
        [&d](std::shared_ptr<Session> const&, json::object const&, Reply const& reply) {
          auto names = d.method_names();
          std::sort(names.begin(), names.end());
          json::array out;
          for (auto& n : names) out.emplace_back(n);
          reply(json::value(json::object{{"methods", std::move(out)}}));
        });
}

std::vector<std::string> deferred_methods() {
  return {};
}

}  // namespace custos::rpc
