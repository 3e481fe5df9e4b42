# --- Naming and tags ---------------------------------------------------------------------------------------

variable "name" {
  description = "Base name of every resource: the queue is <name> (<name>.fifo), the DLQ <name>-dlq, the table <name>-idempotency."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,60}$", var.name))
    error_message = "name must be 1-60 characters of letters, digits, '-' and '_' (SQS and IAM name limits)."
  }
}

variable "tags" {
  description = "Tags added to every resource that takes tags."
  type        = map(string)
  default     = {}
}

variable "kms_key_arn" {
  description = "Customer managed KMS key for the queues, table, topic, log group and schedules. null: AWS managed encryption (SSE-SQS, aws/dynamodb, aws/sns)."
  type        = string
  default     = null
}

# --- Queues ------------------------------------------------------------------------------------------------

variable "fifo_queue" {
  description = "Create FIFO queues (<name>.fifo and <name>-dlq.fifo) instead of standard ones."
  type        = bool
  default     = false
}

variable "queues" {
  description = "A queue set one worker consumes (WORKER_QUEUES), highest priority first: each entry makes the queue <name>-<entry name> with its own DLQ <name>-<entry name>-dlq, and gives its weight. Empty: the one queue <name>."
  type = list(object({
    name   = string
    weight = optional(number, 1)
  }))
  default = []

  validation {
    condition     = alltrue([for entry in var.queues : can(regex("^[A-Za-z0-9_-]{1,30}$", entry.name)) && entry.weight >= 1 && entry.weight <= 1000 && floor(entry.weight) == entry.weight])
    error_message = "each queue needs a name of 1-30 letters, digits, '-' and '_' and a whole weight of 1..1000."
  }

  validation {
    condition     = length(distinct([for entry in var.queues : entry.name])) == length(var.queues)
    error_message = "each queue of the set needs its own name."
  }
}

variable "queues_mode" {
  description = "How the queues of var.queues share a worker's slots (WORKER_QUEUES_MODE): weighted or strict."
  type        = string
  default     = "weighted"

  validation {
    condition     = contains(["weighted", "strict"], var.queues_mode)
    error_message = "queues_mode must be weighted or strict."
  }
}

variable "content_based_deduplication" {
  description = "FIFO only: deduplicate on a hash of the body. Needed for Scheduler targets, which send no deduplication id."
  type        = bool
  default     = true
}

variable "visibility_timeout_s" {
  description = "The queue's visibility timeout; also WORKER_VISIBILITY_TIMEOUT_S (the worker extends it while a job runs)."
  type        = number
  default     = 30

  validation {
    condition     = var.visibility_timeout_s >= 5 && var.visibility_timeout_s <= 43200
    error_message = "visibility_timeout_s must be 5..43200 (the worker's range)."
  }
}

variable "message_retention_s" {
  description = "How long the work queue keeps a message (60..1209599 s); the DLQ keeps them longer."
  type        = number
  default     = 345600

  validation {
    condition     = var.message_retention_s >= 60 && var.message_retention_s < 1209600
    error_message = "message_retention_s must be 60..1209599 so that the DLQ's retention can exceed it."
  }
}

variable "dead_letter_retention_s" {
  description = "How long the DLQ keeps a message; must exceed message_retention_s (a standard DLQ keeps the original enqueue time)."
  type        = number
  default     = 1209600

  validation {
    condition     = var.dead_letter_retention_s >= 120 && var.dead_letter_retention_s <= 1209600
    error_message = "dead_letter_retention_s must be 120..1209600 (14 days)."
  }
}

variable "max_receive_count" {
  description = "Redrive maxReceiveCount: receives before SQS moves a message to the DLQ. Keep it above the jobs' max_attempts."
  type        = number
  default     = 7

  validation {
    condition     = var.max_receive_count >= 1 && var.max_receive_count <= 1000
    error_message = "max_receive_count must be 1..1000."
  }
}

variable "max_message_size" {
  description = "Largest message (bytes) the queues and their DLQs take. SQS takes up to 1048576 (1 MiB, what bootstrap and the test kit use); hashicorp/aws before 6.8 refuses more than 262144 (256 KiB), hence the default."
  type        = number
  default     = 262144

  validation {
    condition     = var.max_message_size >= 1024 && var.max_message_size <= 1048576
    error_message = "max_message_size must be 1024..1048576 bytes (hashicorp/aws before 6.8: at most 262144)."
  }
}

variable "receive_wait_time_s" {
  description = "The queue's default long-polling wait (0..20 s)."
  type        = number
  default     = 20

  validation {
    condition     = var.receive_wait_time_s >= 0 && var.receive_wait_time_s <= 20
    error_message = "receive_wait_time_s must be 0..20."
  }
}

variable "redrive_allow_policy" {
  description = "Attach a redrive-allow policy to the DLQ so that only the work queue can use it. Turn off only for emulators that do not store it (moto), where the provider would wait for it forever."
  type        = bool
  default     = true
}

# --- Idempotency table -------------------------------------------------------------------------------------

variable "create_idempotency_table" {
  description = "Create the DynamoDB idempotency table <name>-idempotency (partition key 'key', TTL on 'expiration')."
  type        = bool
  default     = true
}

variable "table_deletion_protection" {
  description = "Protect the idempotency table from deletion."
  type        = bool
  default     = true
}

# --- Schedules ---------------------------------------------------------------------------------------------

variable "schedules_file" {
  description = "Path of the schedule YAML file the worker also reads (see docs/terraform.md). null: no schedules."
  type        = string
  default     = null
}

variable "schedule_retry_attempts" {
  description = "Scheduler's retries of a failed delivery to the queue (0..185) before it goes to the scheduler DLQ."
  type        = number
  default     = 10

  validation {
    condition     = var.schedule_retry_attempts >= 0 && var.schedule_retry_attempts <= 185
    error_message = "schedule_retry_attempts must be 0..185."
  }
}

variable "schedule_max_event_age_s" {
  description = "How long Scheduler keeps retrying one fire (60..86400 s)."
  type        = number
  default     = 3600

  validation {
    condition     = var.schedule_max_event_age_s >= 60 && var.schedule_max_event_age_s <= 86400
    error_message = "schedule_max_event_age_s must be 60..86400."
  }
}

# --- Alarms and dashboard ----------------------------------------------------------------------------------

variable "alarm_topic_arn" {
  description = "SNS topic for alarm notifications. null: the module creates <name>-alarms."
  type        = string
  default     = null
}

variable "alarm_oldest_message_age_s" {
  description = "Alarm when the oldest message in the queue is older than this."
  type        = number
  default     = 600
}

variable "alarm_queue_depth" {
  description = "Alarm when more messages than this wait in the queue."
  type        = number
  default     = 1000
}

variable "alarm_evaluation_periods" {
  description = "Consecutive one-minute periods over the threshold before the age and depth alarms fire."
  type        = number
  default     = 5
}

variable "metrics_namespace" {
  description = "CloudWatch namespace of the worker's own metrics (WORKER_METRICS_NAMESPACE)."
  type        = string
  default     = "SqsWorker"
}

variable "create_dashboard" {
  description = "Create the CloudWatch dashboard <name>."
  type        = bool
  default     = true
}

# --- Worker settings passed to the task --------------------------------------------------------------------

variable "handlers" {
  description = "Modules that register the job handlers (WORKER_HANDLERS)."
  type        = list(string)
  default     = []
}

variable "concurrency" {
  description = "Jobs one task runs at once (WORKER_CONCURRENCY)."
  type        = number
  default     = 10
}

variable "prefetch" {
  description = "Messages each worker process holds beyond its concurrency, started the moment a job ends (WORKER_PREFETCH); 0: none."
  type        = number
  default     = 0

  validation {
    condition     = var.prefetch >= 0 && var.prefetch <= 1000 && floor(var.prefetch) == var.prefetch
    error_message = "prefetch must be a whole number 0..1000."
  }
}

variable "shutdown_grace_s" {
  description = "Time running jobs get to finish on SIGTERM (WORKER_SHUTDOWN_GRACE_S). The container's stopTimeout is this plus 10 s, at most ECS's 120 s."
  type        = number
  default     = 30

  validation {
    condition     = var.shutdown_grace_s >= 0 && var.shutdown_grace_s <= 110
    error_message = "shutdown_grace_s must be 0..110 so that ECS's stopTimeout (max 120 s) can exceed it."
  }
}

variable "container_schedules_file" {
  description = "Path of the schedule file inside the image, set as WORKER_SCHEDULES_FILE (for `sqs-worker schedules list` in the container). null: not set; Scheduler fires the jobs in AWS."
  type        = string
  default     = null
}

variable "environment" {
  description = "Extra environment variables for the worker container. The module's own WORKER_* variables win on a clash."
  type        = map(string)
  default     = {}
}

# --- ECS Fargate -------------------------------------------------------------------------------------------

variable "enable_ecs" {
  description = "Create the ECS task definition, service, log group, roles and autoscaling. false: only queues, table, schedules, alarms (for example against a local emulator)."
  type        = bool
  default     = true
}

variable "image" {
  description = "The worker's container image (required when enable_ecs)."
  type        = string
  default     = null
}

variable "ecs_cluster_arn" {
  description = "Cluster to run the service in. null: the module creates <name> with Container Insights on."
  type        = string
  default     = null
}

variable "subnet_ids" {
  description = "Subnets of the service's tasks (required when enable_ecs)."
  type        = list(string)
  default     = []
}

variable "security_group_ids" {
  description = "Security groups of the tasks. Empty: the module creates one in vpc_id allowing only HTTPS out."
  type        = list(string)
  default     = []
}

variable "vpc_id" {
  description = "VPC of the security group the module creates when security_group_ids is empty."
  type        = string
  default     = null
}

variable "assign_public_ip" {
  description = "Give tasks a public IP (subnets without a NAT gateway or VPC endpoints)."
  type        = bool
  default     = false
}

variable "cpu" {
  description = "Task CPU units (1024 = 1 vCPU); the task runs one worker process per whole vCPU (WORKER_PROCESSES)."
  type        = number
  default     = 256
}

variable "memory" {
  description = "Task memory (MiB)."
  type        = number
  default     = 512
}

variable "cpu_architecture" {
  description = "X86_64 or ARM64."
  type        = string
  default     = "X86_64"
}

variable "ecr_repository_arns" {
  description = "ECR repositories the execution role may pull the image from. Empty: a public image, no ECR permissions."
  type        = list(string)
  default     = []
}

variable "log_retention_days" {
  description = "Retention of the worker's CloudWatch log group."
  type        = number
  default     = 365
}

variable "container_health_check" {
  description = "Run `sqs-worker health --check` as the container health check."
  type        = bool
  default     = true
}

variable "min_capacity" {
  description = "Fewest running tasks (autoscaling)."
  type        = number
  default     = 1

  validation {
    condition     = var.min_capacity >= 1
    error_message = "min_capacity must be at least 1: backlog per task is undefined with no task running."
  }
}

variable "max_capacity" {
  description = "Most running tasks (autoscaling)."
  type        = number
  default     = 10
}

variable "target_backlog_per_task" {
  description = "Target of the autoscaling policy: visible messages per running task."
  type        = number
  default     = 100
}

variable "scale_in_cooldown_s" {
  description = "Seconds between scale-in steps."
  type        = number
  default     = 300
}

variable "scale_out_cooldown_s" {
  description = "Seconds between scale-out steps."
  type        = number
  default     = 60
}

# --- The web dashboard (`sqs-worker dashboard`) as a second ECS service behind an internal ALB ---------------

variable "enable_web_dashboard" {
  description = "Run `sqs-worker dashboard` as a second ECS service behind an internal HTTPS ALB (needs enable_ecs)."
  type        = bool
  default     = false
}

variable "web_dashboard_certificate_arn" {
  description = "ACM certificate of the dashboard's HTTPS listener (required with enable_web_dashboard)."
  type        = string
  default     = null
}

variable "web_dashboard_allowed_cidrs" {
  description = "Networks that may reach the internal ALB on 443 (e.g. the VPN's)."
  type        = list(string)
  default     = []
}

variable "web_dashboard_token_secret_arn" {
  description = "Secrets Manager secret holding WORKER_DASHBOARD_TOKEN (one of this or web_dashboard_oidc)."
  type        = string
  default     = null
}

variable "web_dashboard_oidc" {
  description = "OIDC provider the ALB authenticates users with; the dashboard then trusts its x-amzn-oidc-identity header."
  type = object({
    issuer                 = string
    authorization_endpoint = string
    token_endpoint         = string
    user_info_endpoint     = string
    client_id              = string
    client_secret          = string
  })
  default   = null
  sensitive = true
}

variable "web_dashboard_actions" {
  description = "Allow redrive, requeue, purge and fire now from the dashboard (else it is read-only)."
  type        = bool
  default     = false
}
