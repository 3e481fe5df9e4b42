# A worker in a real account: queues, table, the cron jobs of schedules.example.yaml, alarms to a new SNS
# topic, and the ECS Fargate service running the worker image.
#
#   terraform init && terraform apply -var image=... -var vpc_id=... -var 'subnet_ids=["subnet-..."]'

terraform {
  required_version = ">= 1.6"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.60, < 7.0"
    }
  }
}

provider "aws" {
  region = var.region
}

variable "region" {
  description = "AWS region to deploy to."
  type        = string
  default     = "eu-west-1"
}

variable "image" {
  description = "The worker's container image, for example 123456789012.dkr.ecr.eu-west-1.amazonaws.com/billing-worker:1.4.0."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the worker's tasks."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets (with a NAT gateway or VPC endpoints) of the worker's tasks."
  type        = list(string)
}

module "worker" {
  source = "../../modules/sqs-worker"

  name              = "billing-jobs"
  image             = var.image
  vpc_id            = var.vpc_id
  subnet_ids        = var.subnet_ids
  handlers          = ["billing.jobs"]
  schedules_file    = "${path.module}/../../../schedules.example.yaml"
  max_receive_count = 7
  shutdown_grace_s  = 60
  max_capacity      = 20

  tags = {
    service = "billing"
  }
}

output "queue_url" {
  description = "Send jobs here (sqs-worker enqueue, or any SQS client)."
  value       = module.worker.queue_url
}

output "worker_environment" {
  description = "The settings the worker runs with."
  value       = module.worker.worker_environment
}
