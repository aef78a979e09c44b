#!/usr/bin/env bash
# Route the GKE and Compute Engine events elastic-sidecar reacts to into a
# Pub/Sub subscription for one job.
#
# What it creates (each step is skipped when the thing already exists):
#   1. topic        projects/PROJECT/topics/TOPIC (default: CLUSTER-elastic-sidecar-events),
#                   shared by every job of the cluster
#   2. subscription projects/PROJECT/subscriptions/JOBSET-events on that topic
#                   (what the coordinator's --pubsub-subscription names)
#   3. a Cloud Logging sink (default: CLUSTER-elastic-sidecar) sending to the topic:
#        - Compute Engine system events of this cluster's node VMs only (their
#          names start with the node pools' instance-group names, read from
#          `gcloud container node-pools list`): compute.instances.preempted,
#          hostError, terminateOnHostMaintenance, upcomingMaintenance,
#          upcomingInfraMaintenance, automaticRestart, guestTerminate
#          (docs/notices.md: what each means and what the daemon does)
#        - Kubernetes node events of this cluster (maintenance, node deletion)
#      Run it again after adding node pools: the filter names the pools it saw.
#   4. roles/pubsub.publisher on the topic for the sink's writer identity
#   5. GKE cluster notifications, filtered to UpgradeEvent|UpgradeInfoEvent (a
#      node-pool upgrade recreates a slice), published to the same topic. A
#      cluster has one notification topic: if it already publishes to another
#      one, that is left alone with a warning (pass --topic with that topic to
#      share it, or --replace-notifications to move it here).
#   6. roles/pubsub.subscriber on the subscription for the Kubernetes service
#      account NAMESPACE/KSA itself (a Workload Identity Federation principal:
#      no Google service account, no impersonation), and for --grant MEMBER
#      (e.g. the node pool's service account when the coordinator's pod runs on
#      the host network, where Workload Identity does not apply)
#
# Sourcing this file defines functions only; nothing runs until main is called.

set -euo pipefail

readonly EVENT_METHODS=(
  compute.instances.preempted
  compute.instances.hostError
  compute.instances.terminateOnHostMaintenance
  compute.instances.upcomingMaintenance
  compute.instances.upcomingInfraMaintenance
  compute.instances.automaticRestart
  compute.instances.guestTerminate
)
readonly NODE_EVENT_REASONS=(
  MaintenanceWindowScheduled
  MaintenanceWindowStarted
  MaintenanceWindowCleared
  DeletingNode
)

usage() {
  cat <<'USAGE'
Usage: deploy/pubsub/setup.sh --project PROJECT --cluster CLUSTER --location LOCATION --jobset JOBSET [options]

Creates the Pub/Sub topic, the job's subscription, the Cloud Logging sink and the
GKE cluster notifications that elastic-sidecar consumes. Safe to run again.

Required:
  --project PROJECT        Google Cloud project id
  --cluster CLUSTER        GKE cluster name
  --location LOCATION      the cluster's region or zone
  --jobset JOBSET          JobSet name; the subscription is JOBSET-events

Options:
  --topic NAME             topic name (default: CLUSTER-elastic-sidecar-events)
  --sink NAME              Cloud Logging sink name (default: CLUSTER-elastic-sidecar)
  --ack-deadline SECONDS   subscription ack deadline (default: 60)
  --retention DURATION     how long unacked messages are kept (default: 1h)
  --expiration DURATION    delete the subscription after this long unused (default: 7d)
  --namespace NS           namespace of the Kubernetes service account (default: default)
  --ksa NAME               Kubernetes service account granted the subscription
                           (default: elastic-sidecar)
  --grant MEMBER           also grant MEMBER (an IAM member, e.g.
                           serviceAccount:NODE_SA) the subscriber role
  --node-prefix PREFIX     scope Compute Engine events to instances named PREFIX-*
                           (default: every node pool's instance group, looked up)
  --replace-notifications  point the cluster's notifications at TOPIC even when it
                           already publishes to another topic
  --dry-run                print the gcloud commands instead of running them
  -h, --help               show this help

The same settings may be given as environment variables PROJECT, CLUSTER,
LOCATION and JOBSET.
USAGE
}

die() {
  echo "setup.sh: $*" >&2
  echo "Try 'setup.sh --help'." >&2
  exit 2
}

DRY_RUN=0

# Run (or, with --dry-run, print) one command.
run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    printf '%q ' "$@" | sed 's/ $//'
    echo
  else
    "$@"
  fi
}

# True when a describe command succeeds (the resource exists). In a dry run
# nothing is looked up and everything counts as missing.
exists() {
  [[ "$DRY_RUN" == 1 ]] && return 1
  "$@" > /dev/null 2>&1
}

join_or() {
  local out="" item
  for item in "$@"; do
    out+="${out:+ OR }\"${item}\""
  done
  printf '%s' "$out"
}

# The Cloud Logging filter of the sink. $4...: instance-name prefixes of the cluster's nodes.
log_filter() {
  local project=$1 cluster=$2 location=$3
  shift 3
  local names=() prefix
  for prefix in "$@"; do
    names+=("/instances/${prefix}-")
  done
  printf '%s' "(resource.type=\"gce_instance\" AND log_id(\"cloudaudit.googleapis.com/system_event\") AND protoPayload.methodName=($(join_or "${EVENT_METHODS[@]}")) AND protoPayload.resourceName:($(join_or "${names[@]}")))"
  printf '%s' " OR (resource.type=\"k8s_node\" AND log_id(\"events\") AND resource.labels.project_id=\"${project}\" AND resource.labels.cluster_name=\"${cluster}\" AND resource.labels.location=\"${location}\" AND (jsonPayload.source.component=\"NodeTerminationHandler\" OR jsonPayload.reportingComponent=\"NodeTerminationHandler\" OR jsonPayload.reason=($(join_or "${NODE_EVENT_REASONS[@]}"))))"
}

# Instance-name prefixes of the cluster's node VMs: each node pool's managed
# instance groups are named PREFIX-grp and their VMs PREFIX-xxxx.
node_prefixes() {
  local project=$1 cluster=$2 location=$3 urls url name
  urls=$(gcloud container node-pools list --cluster="$cluster" --location="$location" --project="$project" \
    --format='value(instanceGroupUrls)')
  for url in ${urls//;/ }; do
    name=${url##*/}
    printf '%s\n' "${name%-grp}"
  done
}

main() {
  local project="${PROJECT:-}" cluster="${CLUSTER:-}" location="${LOCATION:-}" jobset="${JOBSET:-}"
  local topic="" sink="" ack_deadline=60 retention=1h expiration=7d
  local namespace=default ksa=elastic-sidecar replace_notifications=0
  local grants=() prefixes=()

  while [[ $# -gt 0 ]]; do
    case "$1" in
      -h|--help) usage; return 0 ;;
      --dry-run) DRY_RUN=1; shift; continue ;;
      --replace-notifications) replace_notifications=1; shift; continue ;;
      --project|--cluster|--location|--jobset|--topic|--sink|--ack-deadline|--retention|--expiration|--namespace|--ksa|--grant|--node-prefix)
        [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"
        ;;
      --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}"; continue ;;
      *) die "unknown argument: $1" ;;
    esac
    case "$1" in
      --project) project=$2 ;;
      --cluster) cluster=$2 ;;
      --location) location=$2 ;;
      --jobset) jobset=$2 ;;
      --topic) topic=$2 ;;
      --sink) sink=$2 ;;
      --ack-deadline) ack_deadline=$2 ;;
      --retention) retention=$2 ;;
      --expiration) expiration=$2 ;;
      --grant) grants+=("$2") ;;
      --node-prefix) prefixes+=("$2") ;;
      --namespace) namespace=$2 ;;
      --ksa) ksa=$2 ;;
    esac
    shift 2
  done

  local missing=()
  [[ -n "$project" ]] || missing+=(--project)
  [[ -n "$cluster" ]] || missing+=(--cluster)
  [[ -n "$location" ]] || missing+=(--location)
  [[ -n "$jobset" ]] || missing+=(--jobset)
  [[ ${#missing[@]} -eq 0 ]] || die "missing required argument(s): ${missing[*]}"
  [[ "$ack_deadline" =~ ^[0-9]+$ ]] && (( ack_deadline >= 10 && ack_deadline <= 600 )) \
    || die "--ack-deadline must be 10-600 seconds, got '$ack_deadline'"

  topic=${topic:-${cluster}-elastic-sidecar-events}
  sink=${sink:-${cluster}-elastic-sidecar}
  local subscription="${jobset}-events"
  local topic_path="projects/${project}/topics/${topic}"
  if [[ ${#prefixes[@]} -eq 0 ]]; then
    if [[ "$DRY_RUN" == 1 ]]; then
      run gcloud container node-pools list --cluster="$cluster" --location="$location" --project="$project" \
        --format='value(instanceGroupUrls)'
      prefixes=(NODE_POOL_INSTANCE_PREFIX)
    else
      mapfile -t prefixes < <(node_prefixes "$project" "$cluster" "$location")
      [[ ${#prefixes[@]} -gt 0 ]] || die "cluster $cluster has no node pool instance groups; give --node-prefix"
    fi
  fi
  local filter
  filter=$(log_filter "$project" "$cluster" "$location" "${prefixes[@]}")

  # 1. topic
  if exists gcloud pubsub topics describe "$topic" --project="$project"; then
    echo "topic $topic_path exists" >&2
  else
    run gcloud pubsub topics create "$topic" --project="$project"
  fi

  # 2. the job's subscription
  if exists gcloud pubsub subscriptions describe "$subscription" --project="$project"; then
    echo "subscription projects/${project}/subscriptions/${subscription} exists" >&2
  else
    run gcloud pubsub subscriptions create "$subscription" --project="$project" \
      --topic="$topic" --ack-deadline="$ack_deadline" \
      --message-retention-duration="$retention" --expiration-period="$expiration"
  fi

  # 3. the log sink
  if exists gcloud logging sinks describe "$sink" --project="$project"; then
    run gcloud logging sinks update "$sink" "pubsub.googleapis.com/${topic_path}" \
      --project="$project" --log-filter="$filter"
  else
    run gcloud logging sinks create "$sink" "pubsub.googleapis.com/${topic_path}" \
      --project="$project" --log-filter="$filter"
  fi

  # 4. let the sink publish
  local writer
  if [[ "$DRY_RUN" == 1 ]]; then
    run gcloud logging sinks describe "$sink" --project="$project" --format='value(writerIdentity)'
    writer='WRITER_IDENTITY_OF_THE_SINK'
  else
    writer=$(gcloud logging sinks describe "$sink" --project="$project" --format='value(writerIdentity)')
    [[ -n "$writer" ]] || die "sink $sink has no writer identity"
  fi
  run gcloud pubsub topics add-iam-policy-binding "$topic" --project="$project" \
    --member="$writer" --role=roles/pubsub.publisher

  # 5. GKE cluster notifications (upgrade events) to the same topic, unless the
  #    cluster already sends them elsewhere (one topic per cluster).
  local current=""
  if [[ "$DRY_RUN" != 1 ]]; then
    current=$(gcloud container clusters describe "$cluster" --project="$project" --location="$location" \
      --format='value(notificationConfig.pubsub.topic)' 2>/dev/null || true)
  fi
  if [[ -n "$current" && "$current" != "$topic_path" && "$replace_notifications" != 1 ]]; then
    echo "setup.sh: warning: cluster $cluster already sends its notifications to $current; left as it is." >&2
    echo "  Upgrade notices will not reach the coordinator. Either run again with --topic ${current##*/}" >&2
    echo "  (everything shares that topic; its other subscribers then also see the sink's log entries)," >&2
    echo "  or with --replace-notifications (its subscribers stop getting cluster notifications)." >&2
  else
    run gcloud container clusters update "$cluster" --project="$project" --location="$location" \
      --notification-config="pubsub=ENABLED,pubsub-topic=${topic_path},filter=UpgradeEvent|UpgradeInfoEvent"
  fi

  # 6. who may pull the subscription: the Kubernetes service account itself
  #    (Workload Identity Federation for GKE principal), and --grant members.
  local number
  if [[ "$DRY_RUN" == 1 ]]; then
    run gcloud projects describe "$project" --format='value(projectNumber)'
    number=PROJECT_NUMBER
  else
    number=$(gcloud projects describe "$project" --format='value(projectNumber)')
    [[ "$number" =~ ^[0-9]+$ ]] || die "could not read the project number of $project (got '$number')"
  fi
  local member
  for member in \
    "principal://iam.googleapis.com/projects/${number}/locations/global/workloadIdentityPools/${project}.svc.id.goog/subject/ns/${namespace}/sa/${ksa}" \
    "${grants[@]}"; do
    run gcloud pubsub subscriptions add-iam-policy-binding "$subscription" --project="$project" \
      --member="$member" --role=roles/pubsub.subscriber
  done

  echo "done: coordinator flag --pubsub-subscription=projects/${project}/subscriptions/${subscription}" >&2
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
