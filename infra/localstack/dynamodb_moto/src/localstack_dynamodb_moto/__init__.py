"""A LocalStack provider plugin that serves DynamoDB from moto (selected with PROVIDER_OVERRIDE_DYNAMODB=moto).

LocalStack's own DynamoDB provider downloads Java and DynamoDB Local on first use, which fails offline. This
one answers every DynamoDB operation from moto inside the LocalStack process, and makes item writes take
turns, as real DynamoDB serialises writes to an item (moto's conditional writes are check-then-write).
"""
