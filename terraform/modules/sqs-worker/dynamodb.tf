# The idempotency ledger: one item per idempotency key (partition key "key"), expired by TTL on "expiration".

resource "aws_dynamodb_table" "idempotency" {
  count = var.create_idempotency_table ? 1 : 0

  name                        = local.table_name
  billing_mode                = "PAY_PER_REQUEST"
  hash_key                    = "key"
  deletion_protection_enabled = var.table_deletion_protection
  tags                        = var.tags

  attribute {
    name = "key"
    type = "S"
  }

  attribute {
    name = "status"
    type = "S"
  }

  attribute {
    name = "updated_at"
    type = "N"
  }

  # The dashboard's lists (recent failed and in-progress jobs, live workers, its audit trail) are Queries of
  # this index, never Scans; the same index `sqs-worker bootstrap` creates.
  global_secondary_index {
    name               = "status-updated_at"
    hash_key           = "status"
    range_key          = "updated_at"
    projection_type    = "INCLUDE"
    non_key_attributes = ["job_type", "attempts", "last_error", "progress", "progress_note", "lease_expires_at_ms", "owner", "expiration", "created_at", "detail"]
  }

  ttl {
    attribute_name = "expiration"
    enabled        = true
  }

  point_in_time_recovery {
    enabled = true
  }

  # Without a customer managed key this is the AWS managed key aws/dynamodb.
  server_side_encryption {
    enabled     = true
    kms_key_arn = var.kms_key_arn
  }
}
