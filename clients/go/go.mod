module example.invalid/liveness/clients/go

go 1.19
