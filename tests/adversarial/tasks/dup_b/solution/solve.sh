echo 8
