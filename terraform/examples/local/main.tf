# The module against a local AWS emulator (moto server or LocalStack): everything but ECS, which emulators
# cannot run. Used by the test suite (tests/test_terraform_apply.py):
#
#   terraform apply -var endpoint_url=http://127.0.0.1:5000 -var name=demo

terraform {
  required_version = ">= 1.6"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.60, < 7.0"
    }
  }
}

variable "endpoint_url" {
  description = "The emulator's endpoint, for example http://127.0.0.1:5000."
  type        = string
}

variable "name" {
  description = "Base name of the worker's resources."
  type        = string
  default     = "local-worker"
}

variable "schedules_file" {
  description = "The schedule file."
  type        = string
  default     = null
}

variable "fifo_queue" {
  description = "FIFO queues."
  type        = bool
  default     = false
}

variable "queues" {
  description = "A queue set (WORKER_QUEUES), highest priority first; empty: one queue."
  type = list(object({
    name   = string
    weight = optional(number, 1)
  }))
  default = []
}

variable "queues_mode" {
  description = "weighted or strict."
  type        = string
  default     = "weighted"
}

variable "redrive_allow_policy" {
  description = "Keep false on emulators: moto does not store a DLQ's RedriveAllowPolicy, and LocalStack keeps an empty one after it is removed (apply or destroy would wait for it forever)."
  type        = bool
  default     = false
}

provider "aws" {
  region                      = "us-east-1"
  access_key                  = "testing"
  secret_key                  = "testing"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  skip_region_validation      = true

  endpoints {
    cloudwatch = var.endpoint_url
    dynamodb   = var.endpoint_url
    iam        = var.endpoint_url
    logs       = var.endpoint_url
    scheduler  = var.endpoint_url
    sns        = var.endpoint_url
    sqs        = var.endpoint_url
    sts        = var.endpoint_url
  }
}

module "worker" {
  source = "../../modules/sqs-worker"

  name                      = var.name
  fifo_queue                = var.fifo_queue
  queues                    = var.queues
  queues_mode               = var.queues_mode
  schedules_file            = var.schedules_file
  enable_ecs                = false
  redrive_allow_policy      = var.redrive_allow_policy
  table_deletion_protection = false
  max_receive_count         = 9 # above the default max_attempts (5); not the module default, to show it flows through
  shutdown_grace_s          = 5
}

output "worker" {
  description = "Every output of the module."
  value       = module.worker
}
