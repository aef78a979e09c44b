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
#        - Compute Engine system events of TPU VMs: compute.instances.preempted,
#          hostError, terminateOnHostMaintenance, upcomingMaintenance,
#          upcomingInfraMaintenance, automaticRestart, guestTerminate
#          (docs/notices.md: what each means and what the daemon does)
#        - Kubernetes node events of this cluster from NodeTerminationHandler
#          (MaintenanceWindowScheduled/Started/Cleared, ...) and node deletion
#   4. roles/pubsub.publisher on the topic for the sink's writer identity
#   5. GKE cluster notifications (upgrade events: a node-pool upgrade recreates
#      a slice) published to the same topic
#   6. with --service-account GSA: roles/pubsub.subscriber on the subscription
#      for GSA, and Workload Identity: the Kubernetes service account
#      NAMESPACE/KSA may act as GSA (the annotation in deploy/common/serviceaccount.yaml)
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
  --service-account GSA    grant GSA the subscriber role on the subscription and bind
                           it to the Kubernetes service account through Workload Identity
  --namespace NS           namespace of the Kubernetes service account (default: default)
  --ksa NAME               Kubernetes service account (default: elastic-sidecar)
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

# The Cloud Logging filter of the sink.
log_filter() {
  local project=$1 cluster=$2 location=$3
  printf '%s' "(resource.type=\"gce_instance\" AND log_id(\"cloudaudit.googleapis.com/system_event\") AND protoPayload.methodName=($(join_or "${EVENT_METHODS[@]}")))"
  printf '%s' " OR (resource.type=\"k8s_node\" AND log_id(\"events\") AND resource.labels.project_id=\"${project}\" AND resource.labels.cluster_name=\"${cluster}\" AND resource.labels.location=\"${location}\" AND (jsonPayload.source.component=\"NodeTerminationHandler\" OR jsonPayload.reportingComponent=\"NodeTerminationHandler\" OR jsonPayload.reason=($(join_or "${NODE_EVENT_REASONS[@]}"))))"
}

main() {
  local project="${PROJECT:-}" cluster="${CLUSTER:-}" location="${LOCATION:-}" jobset="${JOBSET:-}"
  local topic="" sink="" ack_deadline=60 retention=1h expiration=7d
  local gsa="" namespace=default ksa=elastic-sidecar

  while [[ $# -gt 0 ]]; do
    case "$1" in
      -h|--help) usage; return 0 ;;
      --dry-run) DRY_RUN=1; shift; continue ;;
      --project|--cluster|--location|--jobset|--topic|--sink|--ack-deadline|--retention|--expiration|--service-account|--namespace|--ksa)
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
      --service-account) gsa=$2 ;;
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
  local filter
  filter=$(log_filter "$project" "$cluster" "$location")

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

  # 5. GKE cluster notifications (upgrade events) to the same topic
  run gcloud container clusters update "$cluster" --project="$project" --location="$location" \
    --notification-config="pubsub=ENABLED,pubsub-topic=${topic_path}"

  # 6. the coordinator's identity
  if [[ -n "$gsa" ]]; then
    run gcloud pubsub subscriptions add-iam-policy-binding "$subscription" --project="$project" \
      --member="serviceAccount:${gsa}" --role=roles/pubsub.subscriber
    run gcloud iam service-accounts add-iam-policy-binding "$gsa" --project="$project" \
      --member="serviceAccount:${project}.svc.id.goog[${namespace}/${ksa}]" \
      --role=roles/iam.workloadIdentityUser
  fi

  echo "done: coordinator flag --pubsub-subscription=projects/${project}/subscriptions/${subscription}" >&2
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
