# Mocked AWS values shared by the module's tests (referenced by mock_provider "aws" { source = ... }).
mock_resource "aws_iam_role" {
  defaults = { arn = "arn:aws:iam::123456789012:role/mock" }
}
mock_resource "aws_sns_topic" {
  defaults = { arn = "arn:aws:sns:us-east-1:123456789012:mock-alarms" }
}
mock_resource "aws_dynamodb_table" {
  defaults = { arn = "arn:aws:dynamodb:us-east-1:123456789012:table/mock-idempotency" }
}
mock_resource "aws_cloudwatch_log_group" {
  defaults = { arn = "arn:aws:logs:us-east-1:123456789012:log-group:/ecs/mock" }
}
mock_resource "aws_ecs_cluster" {
  defaults = { arn = "arn:aws:ecs:us-east-1:123456789012:cluster/mock-cluster" }
}
mock_resource "aws_ecs_task_definition" {
  defaults = { arn = "arn:aws:ecs:us-east-1:123456789012:task-definition/mock:1" }
}
mock_data "aws_region" {
  defaults = { name = "us-east-1" }
}
mock_data "aws_vpc" {
  defaults = { cidr_block = "10.0.0.0/16" }
}
mock_resource "aws_lb" {
  defaults = { arn = "arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/app/mock/0123456789abcdef", dns_name = "internal-mock.us-east-1.elb.amazonaws.com" }
}
mock_resource "aws_lb_target_group" {
  defaults = { arn = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/mock/0123456789abcdef" }
}
mock_data "aws_caller_identity" {
  defaults = { account_id = "123456789012" }
}

override_resource {
  target = aws_sqs_queue.queue
  values = {
    arn = "arn:aws:sqs:us-east-1:123456789012:queue"
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/queue"
  }
}

override_resource {
  target = aws_sqs_queue.dlq
  values = {
    arn = "arn:aws:sqs:us-east-1:123456789012:dlq"
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/dlq"
  }
}

override_resource {
  target = aws_sqs_queue.scheduler_dlq
  values = {
    arn = "arn:aws:sqs:us-east-1:123456789012:scheduler-dlq"
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/scheduler-dlq"
  }
}
