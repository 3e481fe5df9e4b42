"""Queue edges: the AWS client factory and error table, SQS calls, batching."""
