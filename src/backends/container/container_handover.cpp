// A container execution across a daemon restart: adopted after a crash (the tree only, the
// engine's stream died with the previous daemon), or carried across a handover, where the
// hijacked engine connection goes to the next image with where its stream stood, so the exec's
// output and input go on with nothing lost (docs/containers.md, "Across a handover").
//
// The carried state is this backend's own JSON (CarriedStdio::state), written by one image and
// read by the next, which may be a newer build: every member is read with a check, and a state
// that does not read is never guessed at — the exec's streams then end incomplete.
#include <boost/json.hpp>

#include "custos/backend/native.hpp"
#include "custos/core/base64.hpp"
#include "custos/core/canonical.hpp"
#include "custos/core/json_fields.hpp"
#include "custos/sys/identity.hpp"

#include "container_execution.hpp"

namespace custos::backend {
namespace {

namespace json = boost::json;

json::value identity_json(sys::PidfsIdentity const& id) {
  return json::object{{"pid", id.pid},
                      {"boot_id", id.boot_id},
                      {"pidfs_dev", id.pidfs_dev},
                      {"pidfs_ino", id.pidfs_ino},
                      {"start_time_ticks", id.start_time_ticks}};
}

json::object stream_json(engine::ExecStreamState const& s) {
  return json::object{
      {"tty", s.tty},
      {"header_hex", core::to_hex(s.position.header)},
      {"remaining", s.position.remaining},
      {"stream", static_cast<unsigned>(s.position.stream)},  // stdcopy's own stream number
      {"frames", s.position.frames},
      {"unread_b64", core::base64_encode(s.unread)},
      {"engine_message", s.engine_message},
      {"input_closed", s.input_closed},
      {"bytes_read", s.bytes_read},
  };
}

// What a previous image carried for one exec (the members of CarriedStdio::state).
struct CarriedExec {
  std::string exec_id;
  std::string container_id;
  std::string placement;
  bool ungated = false;
  std::optional<sys::PidfsIdentity> init;
  bool init_gone = false;  // the init had ended (the container stopped) before the handover
  std::optional<engine::ExecStreamState> stream;  // none: the stream had ended, or was lost
  std::string lost;  // why the stream could not go on (empty: it went on, or had ended)
};

Result<CarriedExec> read_carried(json::object const& o) {
  core::FieldReader r{core::FieldCodes{Errc::engine_failed, Errc::engine_failed,
                                       Errc::engine_failed, Errc::engine_failed,
                                       Errc::engine_failed}};
  CarriedExec c;
  if (auto const* v = r.required(o, "", "exec")) (void)r.string(*v, "/exec", c.exec_id);
  if (auto const* v = r.required(o, "", "container")) {
    (void)r.string(*v, "/container", c.container_id);
  }
  if (auto const* v = r.required(o, "", "placement")) {
    (void)r.string(*v, "/placement", c.placement);
  }
  if (auto const* v = r.required(o, "", "ungated")) (void)r.boolean(*v, "/ungated", c.ungated);
  if (auto const* v = r.required(o, "", "init_gone")) {
    (void)r.boolean(*v, "/init_gone", c.init_gone);
  }
  if (auto const* v = r.required(o, "", "lost")) (void)r.string(*v, "/lost", c.lost);
  if (auto const* v = core::FieldReader::given(o, "init")) {
    if (auto const* io = r.object(*v, "/init")) {
      sys::PidfsIdentity id;
      if (auto const* p = r.required(*io, "/init", "pid")) (void)r.int32(*p, "/init/pid", id.pid);
      if (auto const* p = r.required(*io, "/init", "boot_id")) {
        (void)r.string(*p, "/init/boot_id", id.boot_id);
      }
      if (auto const* p = r.required(*io, "/init", "pidfs_dev")) {
        (void)r.unsigned_int(*p, "/init/pidfs_dev", id.pidfs_dev);
      }
      if (auto const* p = r.required(*io, "/init", "pidfs_ino")) {
        (void)r.unsigned_int(*p, "/init/pidfs_ino", id.pidfs_ino);
      }
      if (auto const* p = r.required(*io, "/init", "start_time_ticks")) {
        (void)r.unsigned_int(*p, "/init/start_time_ticks", id.start_time_ticks);
      }
      c.init = id;
    }
  }
  if (auto const* v = core::FieldReader::given(o, "stream")) {
    if (auto const* so = r.object(*v, "/stream")) {
      engine::ExecStreamState s;
      std::string hex;
      std::uint64_t stream = 0;
      std::string unread;
      std::uint64_t remaining = 0;
      if (auto const* p = r.required(*so, "/stream", "tty"))
        (void)r.boolean(*p, "/stream/tty", s.tty);
      if (auto const* p = r.required(*so, "/stream", "header_hex")) {
        (void)r.string(*p, "/stream/header_hex", hex);
      }
      if (auto const* p = r.required(*so, "/stream", "remaining")) {
        (void)r.unsigned_int(*p, "/stream/remaining", remaining);
      }
      if (auto const* p = r.required(*so, "/stream", "stream")) {
        // Its range is checked with the rest of the position (FrameDemuxer::resume).
        (void)r.unsigned_int(*p, "/stream/stream", 255, Errc::engine_failed, stream);
      }
      if (auto const* p = r.required(*so, "/stream", "frames")) {
        (void)r.unsigned_int(*p, "/stream/frames", s.position.frames);
      }
      if (auto const* p = r.required(*so, "/stream", "unread_b64")) {
        (void)r.string(*p, "/stream/unread_b64", unread);
      }
      if (auto const* p = r.required(*so, "/stream", "engine_message")) {
        (void)r.string(*p, "/stream/engine_message", s.engine_message);
      }
      if (auto const* p = r.required(*so, "/stream", "input_closed")) {
        (void)r.boolean(*p, "/stream/input_closed", s.input_closed);
      }
      if (auto const* p = r.required(*so, "/stream", "bytes_read")) {
        (void)r.unsigned_int(*p, "/stream/bytes_read", s.bytes_read);
      }
      auto header = core::from_hex(hex);
      if (!header) r.add(Errc::engine_failed, "/stream/header_hex", "not hex");
      if (header) s.position.header = std::move(*header);
      auto bytes = core::base64_decode(unread);
      if (!bytes) r.add(Errc::engine_failed, "/stream/unread_b64", "not base64");
      if (bytes) s.unread = std::move(*bytes);
      s.position.remaining = static_cast<std::size_t>(remaining);
      s.position.stream = static_cast<engine::StdStream>(stream);
      c.stream = std::move(s);
    }
  }
  if (!r.ok()) return std::move(r).error();
  return c;
}

}  // namespace

std::optional<CarriedStdio> ContainerExecution::hand_over_stdio() {
  // A launch still at its gate is abandoned by detach(); a program that ended before it was
  // identified has nothing left to carry.
  if (launching_ || detached_ || !tree_ || root_unseen_) return std::nullopt;
  CarriedStdio io;
  io.pty = io_state_.tty;
  json::object state{{"exec", exec_id_},        {"container", container_id_},
                     {"placement", placement_}, {"ungated", ungated_},
                     {"init", nullptr},         {"init_gone", init_gone_},
                     {"stream", nullptr},       {"lost", handover_lost_}};
  if (init_ && !init_gone_) {
    // An init that cannot be identified any more has ended: the container stopped.
    auto id = sys::read_identity(*init_);
    if (id && init_->alive()) {
      state["init"] = identity_json(*id);
    } else {
      state["init_gone"] = true;
    }
  }
  if (io_state_.stream && io_state_.open) {
    // Every byte read from the connection so far was delivered to the port (reads happen only
    // when it is readable, each delivered before the next); what the engine sent since stays in
    // the socket for the next image.
    if (auto released = io_state_.stream->release()) {
      io.connection = std::move(released->connection);
      state["stream"] = stream_json(released->state);
    } else {
      // Closed with this image: the next one ends the streams incomplete and says why.
      state["lost"] = "the engine stream could not be released: " + released.error().message();
    }
    io_state_.open = false;
  }
  io_state_.stream.reset();
  io.state = std::move(state);
  return io;
}

Result<Acquired> ContainerExecution::adopt(AdoptContext ctx) {
  // The container's namespace as recorded; else read through the recovered root (live: its pid).
  if (!ctx.pid_ns_inode && ctx.root.valid()) {
    auto ns = sys::pid_namespace_inode(std::to_string(ctx.root.pid()));
    if (ns && ctx.root.alive()) ctx.pid_ns_inode = *ns;
  }
  pid_ns_ = ctx.pid_ns_inode.value_or(0);
  std::optional<CarriedStdio> carried = std::move(ctx.stdio);
  ctx.stdio.reset();  // the tree half never had stdio of its own
  core::ExecutionPlan const* plan = ctx.plan;
  PlanView const* view = ctx.view;
  tree_ = host_->native().create(id_);
  auto acq = CUSTOS_TRY(tree_->adopt(std::move(ctx)));
  if (carried) take_carried(std::move(*carried), *plan, *view);
  return acq;
}

void ContainerExecution::take_carried(CarriedStdio carried, core::ExecutionPlan const& plan,
                                      PlanView const& view) {
  io_state_.tty = view.pty;
  io_state_.chunk_bytes = static_cast<std::size_t>(view.chunk_bytes);
  client_ = host_->client(plan.backend.socket.value_or(""));
  carried_ = true;
  auto c = read_carried(carried.state);
  if (!c) {
    handover_lost_ = "the carried state does not read: " + c.error().message();
    return;
  }
  exec_id_ = c->exec_id;
  container_id_ = c->container_id;
  placement_ = c->placement;
  ungated_ = c->ungated;
  init_gone_ = c->init_gone;
  if (c->init && !init_gone_) {
    // The container's init, re-identified: a pid alone is never trusted. Gone (or another
    // process by now): the container stopped while no image watched it.
    auto fd = sys::Pidfd::open(c->init->pid);
    auto id = fd ? sys::read_identity(*fd) : Result<sys::PidfsIdentity>{fd.error()};
    if (id && *id == *c->init) {
      init_ = std::move(*fd);
    } else if (id || id.error().sys_errno == ESRCH) {
      init_gone_ = true;
    }
  }
  if (!c->lost.empty()) {
    handover_lost_ = c->lost;
    return;
  }
  if (!c->stream) return;  // ended before the handover: the pumps say so
  if (!carried.connection.valid()) {
    handover_lost_ = "the stream was open but no connection was carried";
    return;
  }
  if (c->stream->tty != io_state_.tty) {
    handover_lost_ = "the carried stream's terminal mode is not the plan's";
    return;
  }
  auto s = client_->resume_stream(exec_id_, std::move(carried.connection), std::move(*c->stream));
  if (!s) {
    handover_lost_ = s.error().message();
    return;
  }
  io_state_.stream = std::move(*s);
  io_state_.open = true;
}

}  // namespace custos::backend
