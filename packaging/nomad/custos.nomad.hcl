# custos on every Nomad client: a system job, one daemon per node (docs/fleet.md, "Nomad").
# custos.nomad.json is the same job in the API's JSON form (`nomad job run -json
# custos.nomad.json`); packaging/test_fleet.py checks that both state the same values and runs
# the daemon with the embedded entrypoint and configuration.
#
# raw_exec, not exec or docker: the daemon must see the host as systemd would run it: the host's
# mount namespace (executions' workspaces are host paths), PID namespace and cgroup hierarchy, as
# root. The client must enable raw_exec (plugin "raw_exec" { config { enabled = true } }), and
# the packaged systemd units must be off on these hosts (systemctl disable --now custos.socket
# custos.service): a second daemon on the node fails on the state dir's lock.
job "custos" {
  type        = "system"
  datacenters = ["*"]

  # One node at a time: a restart cancels that node's executions.
  update {
    max_parallel = 1
    stagger      = "30s"
  }

  group "custos" {
    restart {
      attempts = 10
      interval = "30m"
      delay    = "5s"
      mode     = "delay"
    }

    task "custos" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["${NOMAD_TASK_DIR}/custos-entrypoint", "--config", "${NOMAD_TASK_DIR}/custos.toml"]
      }

      # packaging/container/custos-entrypoint, verbatim: splits the task's cgroup into the
      # daemon's leaf and the executions' subtree, then execs `custos daemon`.
      template {
        destination = "local/custos-entrypoint"
        perms       = "0755"
        change_mode = "restart"
        data        = <<EOT
#!/bin/sh
# custos-entrypoint [custos daemon flags...] — starts `custos daemon` in a cgroup an orchestrator
# gave it (a Kubernetes container, a Nomad raw_exec task), the way Delegate=yes does under
# systemd (docs/fleet.md, "The cgroup").
#
# cgroup v2 lets a cgroup enable controllers for its children only while it holds no process
# itself, and the orchestrator starts us inside the cgroup it made for the task. So this script
# moves itself into a leaf `<task cgroup>/daemon`, enables cpu, memory and pids in the task
# cgroup (best effort: each one the kernel refuses stays sampled-only, as `custos doctor` shows)
# and execs the daemon with its execution cgroups in `<task cgroup>/custos`.
#
# CUSTOS_CGROUP: the task cgroup's directory (default: this process's cgroup under the v2
# mount). CUSTOS_BIN: the binary (default /usr/bin/custos).
#
# The text has no dollar-brace and no double curly brace: the Nomad job embeds it verbatim in a
# template, where HCL would interpolate the one and the template engine the other.
set -e

bin=$CUSTOS_BIN
[ -n "$bin" ] || bin=/usr/bin/custos
task=$CUSTOS_CGROUP
if [ -z "$task" ]; then
  mount=$(awk '$0 ~ / - cgroup2 / { print $5; exit }' /proc/self/mountinfo)
  own=$(sed -n 's/^0:://p' /proc/self/cgroup)
  if [ -z "$mount" ] || [ -z "$own" ]; then
    echo "custos-entrypoint: no cgroup v2 mount or no 0:: line in /proc/self/cgroup" >&2
    exit 1
  fi
  task=$(printf '%s%s' "$mount" "$own")
fi
task=$(printf '%s' "$task" | sed 's:/*$::')
# A systemd service's cgroup (the Nomad agent's own, for a raw_exec task without a cgroup of its
# own) is not ours to split.
case "$task" in
*.service)
  echo "custos-entrypoint: $task is a systemd service's cgroup, not one made for this task" >&2
  exit 1
  ;;
esac
# Nor is the root (the only cgroup without cgroup.type): we were started in no cgroup of our
# own, or in a private cgroup namespace (where /proc/self/cgroup says "/") with the host's whole
# hierarchy mounted, so that the path names the host's root, not ours.
if [ ! -e "$task/cgroup.type" ]; then
  echo "custos-entrypoint: $task is no cgroup of this task's own (a root cgroup, or not a" \
    "cgroup at all); start in the host's cgroup namespace, in a cgroup made for the task" >&2
  exit 1
fi

mkdir -p "$task/daemon"
echo $$ >"$task/daemon/cgroup.procs"
for c in cpu memory pids; do
  if grep -qw "$c" "$task/cgroup.controllers" &&
    ! echo "+$c" >"$task/cgroup.subtree_control" 2>/dev/null; then
    echo "custos-entrypoint: cannot enable $c in $task; its limits stay sampled only" >&2
  fi
done

exec "$bin" daemon --cgroup-subtree "$task/custos" "$@"
EOT
      }

      # The same configuration as the Kubernetes ConfigMap (state and socket on the host).
      template {
        destination = "local/custos.toml"
        perms       = "0644"
        change_mode = "restart"
        data        = <<EOT
[daemon]
state-dir = "/var/lib/custos"
socket = "/run/custos/custos.sock"
# The daemon binds the socket as root:root with this mode and cannot chown it (under systemd
# custos.socket sets group custos). 0666 lets every uid on the node reach the daemon;
# each call is still authorized by the caller's peer uid (docs/fleet.md, "Reaching the socket").
socket-mode = "0666"
# Admins beside root: a gid by number, the same on every node (the image's group `custos`
# has whatever gid its postinst picked, unrelated to the hosts' groups).
# admin-group = "990"
# Pod stop (rollout, drain, delete): cancel every execution and write its terminal record.
# terminationGracePeriodSeconds below covers 2 x this timeout.
shutdown = "cancel"
shutdown-timeout-ms = 20000
log-level = "info"
# stderr, which the container runtime keeps (`kubectl logs`).
log-target = "console"
no-socket-activation = true
EOT
      }

      # SIGTERM to the daemon: its shutdown policy applies. shutdown-timeout-ms bounds two waits
      # (in-flight launches, then the cancelled executions' terminal records): 2 x 20 s plus 5 s.
      # Nomad caps kill_timeout at the client's max_kill_timeout (30s unless raised).
      kill_signal  = "SIGTERM"
      kill_timeout = "45s"

      # Executions run in cgroups below this task's: whatever Nomad enforces on the task's
      # cgroup applies to all of them together. Size it for the node's executions.
      resources {
        cpu    = 100
        memory = 512
      }
    }
  }
}
