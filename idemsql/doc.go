package idemsql
