module kallot.invalid/testenv/node/pause

go 1.26.0
